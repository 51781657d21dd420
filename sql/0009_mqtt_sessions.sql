-- Durable MQTT sessions (migration 0009_mqtt_sessions, issue 16). A persistent session (3.1.1
-- clean session = 0, 5.0 session expiry > 0) is owned by one live node, which keeps it in memory
-- and writes every change through to these tables, so a restart (even kill -9), another node or
-- a takeover finds it: subscriptions, QoS 1/2 messages queued or in flight (both directions), the
-- will and the expiry. Clean sessions write nothing here.

CREATE TABLE fluxpg.mqtt_sessions (
    client_id       text PRIMARY KEY,
    node_id         int,
    connected       boolean NOT NULL DEFAULT false,
    expiry_interval bigint NOT NULL,
    disconnected_at timestamptz,
    protocol_level  smallint NOT NULL,
    will            jsonb,
    will_payload    bytea,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX mqtt_sessions_node ON fluxpg.mqtt_sessions (node_id);
COMMENT ON TABLE fluxpg.mqtt_sessions IS 'Persistent MQTT sessions: one row per client id whose session outlives its connection';
COMMENT ON COLUMN fluxpg.mqtt_sessions.client_id IS 'MQTT client identifier';
COMMENT ON COLUMN fluxpg.mqtt_sessions.node_id IS 'fluxpg.nodes.id of the node that owns the session (keeps it in memory); a dead or NULL owner is adopted by a live node';
COMMENT ON COLUMN fluxpg.mqtt_sessions.connected IS 'A client connection is attached (at the owner node)';
COMMENT ON COLUMN fluxpg.mqtt_sessions.expiry_interval IS 'Session expiry interval in seconds after disconnect (4294967295 = never)';
COMMENT ON COLUMN fluxpg.mqtt_sessions.disconnected_at IS 'When the last connection ended; expiry counts from here';
COMMENT ON COLUMN fluxpg.mqtt_sessions.protocol_level IS 'MQTT protocol level of the last connection (4 = 3.1.1, 5 = 5.0)';
COMMENT ON COLUMN fluxpg.mqtt_sessions.will IS 'Will message of the current connection without its payload: topic, qos, retain, props, delay, expires_in (NULL = none)';
COMMENT ON COLUMN fluxpg.mqtt_sessions.will_payload IS 'Payload of the will message';
COMMENT ON COLUMN fluxpg.mqtt_sessions.updated_at IS 'Last change of the row';

CREATE TABLE fluxpg.mqtt_session_subscriptions (
    client_id       text NOT NULL REFERENCES fluxpg.mqtt_sessions (client_id) ON DELETE CASCADE,
    topic_filter    text NOT NULL,
    qos             smallint NOT NULL CHECK (qos BETWEEN 0 AND 2),
    no_local        boolean NOT NULL DEFAULT false,
    retain_as_published boolean NOT NULL DEFAULT false,
    retain_handling smallint NOT NULL DEFAULT 0,
    subscription_id int,
    queue_group     text,
    PRIMARY KEY (client_id, topic_filter)
);
COMMENT ON TABLE fluxpg.mqtt_session_subscriptions IS 'Subscriptions of persistent MQTT sessions, with their MQTT 5 options';
COMMENT ON COLUMN fluxpg.mqtt_session_subscriptions.client_id IS 'Session (fluxpg.mqtt_sessions.client_id)';
COMMENT ON COLUMN fluxpg.mqtt_session_subscriptions.topic_filter IS 'Topic filter as subscribed ($share/<g>/… and $queue/… included)';
COMMENT ON COLUMN fluxpg.mqtt_session_subscriptions.qos IS 'Maximum QoS granted';
COMMENT ON COLUMN fluxpg.mqtt_session_subscriptions.no_local IS 'MQTT 5 no local option';
COMMENT ON COLUMN fluxpg.mqtt_session_subscriptions.retain_as_published IS 'MQTT 5 retain as published option';
COMMENT ON COLUMN fluxpg.mqtt_session_subscriptions.retain_handling IS 'MQTT 5 retain handling option (0, 1, 2)';
COMMENT ON COLUMN fluxpg.mqtt_session_subscriptions.subscription_id IS 'MQTT 5 subscription identifier, NULL when none';
COMMENT ON COLUMN fluxpg.mqtt_session_subscriptions.queue_group IS 'For $queue/ subscriptions: the consumer group (the queue keeps the messages); NULL for plain topics';

CREATE TABLE fluxpg.mqtt_session_messages (
    client_id   text NOT NULL REFERENCES fluxpg.mqtt_sessions (client_id) ON DELETE CASCADE,
    key         bigint NOT NULL,
    packet_id   int,
    stage       smallint NOT NULL DEFAULT 0 CHECK (stage BETWEEN 0 AND 2),
    topic       text NOT NULL,
    payload     bytea NOT NULL,
    qos         smallint NOT NULL CHECK (qos BETWEEN 1 AND 2),
    retain      boolean NOT NULL DEFAULT false,
    props       jsonb,
    expires_at  timestamptz,
    sub_ids     int[],
    PRIMARY KEY (client_id, key)
);
COMMENT ON TABLE fluxpg.mqtt_session_messages IS 'Outbound QoS 1/2 messages of persistent MQTT sessions: queued (offline or above the in-flight window) or in flight';
COMMENT ON COLUMN fluxpg.mqtt_session_messages.client_id IS 'Session (fluxpg.mqtt_sessions.client_id)';
COMMENT ON COLUMN fluxpg.mqtt_session_messages.key IS 'Order of the message within the session';
COMMENT ON COLUMN fluxpg.mqtt_session_messages.packet_id IS 'Packet identifier once sent (resent with DUP on reconnect); NULL while queued';
COMMENT ON COLUMN fluxpg.mqtt_session_messages.stage IS '0 queued, 1 PUBLISH sent, 2 QoS 2: PUBREC received, PUBREL sent (only PUBREL is resent)';
COMMENT ON COLUMN fluxpg.mqtt_session_messages.topic IS 'Topic name';
COMMENT ON COLUMN fluxpg.mqtt_session_messages.payload IS 'Payload';
COMMENT ON COLUMN fluxpg.mqtt_session_messages.qos IS 'QoS of this delivery (1 or 2)';
COMMENT ON COLUMN fluxpg.mqtt_session_messages.retain IS 'RETAIN flag of this delivery';
COMMENT ON COLUMN fluxpg.mqtt_session_messages.props IS 'MQTT 5 properties forwarded (same format as mqtt_relay.props)';
COMMENT ON COLUMN fluxpg.mqtt_session_messages.expires_at IS 'Message expiry; NULL = never';
COMMENT ON COLUMN fluxpg.mqtt_session_messages.sub_ids IS 'Subscription identifiers sent with it';

CREATE TABLE fluxpg.mqtt_session_inbound (
    client_id   text NOT NULL REFERENCES fluxpg.mqtt_sessions (client_id) ON DELETE CASCADE,
    packet_id   int NOT NULL,
    PRIMARY KEY (client_id, packet_id)
);
COMMENT ON TABLE fluxpg.mqtt_session_inbound IS 'Inbound QoS 2 packet ids of persistent sessions between PUBREC and PUBREL (a resent PUBLISH is not delivered twice)';
COMMENT ON COLUMN fluxpg.mqtt_session_inbound.client_id IS 'Session (fluxpg.mqtt_sessions.client_id)';
COMMENT ON COLUMN fluxpg.mqtt_session_inbound.packet_id IS 'Packet identifier of the QoS 2 PUBLISH answered with PUBREC';
