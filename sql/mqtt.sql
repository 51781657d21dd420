-- MQTT front-end tables (migration 0002_mqtt): the cross-node relay of plain pub/sub messages and
-- the retained messages. Both live in schema fluxpg; the downgrade drops exactly these two tables.

-- Relay: a node that publishes on a plain (non-$queue/) topic while other nodes are alive inserts
-- the batch here and sends ONE `NOTIFY fluxpg_mqtt, '<node>:<first id>:<last id>'` in the same
-- transaction; the other nodes read exactly that id range. UNLOGGED because the rows are only
-- needed for the seconds it takes every node to read them (a crash loses in-flight QoS 0/1/2
-- pub/sub messages, as a restart of any MQTT broker does); each node deletes its own old rows.
CREATE UNLOGGED TABLE fluxpg.mqtt_relay (
    id         bigserial PRIMARY KEY,
    node_id    int NOT NULL,
    origin     text,
    topic      text NOT NULL,
    payload    bytea NOT NULL,
    qos        smallint NOT NULL CHECK (qos BETWEEN 0 AND 2),
    retain     boolean NOT NULL DEFAULT false,
    props      jsonb,
    expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX mqtt_relay_node_created ON fluxpg.mqtt_relay (node_id, created_at);
COMMENT ON TABLE fluxpg.mqtt_relay IS 'MQTT pub/sub messages on their way from the node that received them to the other nodes (read by id range announced with NOTIFY fluxpg_mqtt; pruned after a minute)';
COMMENT ON COLUMN fluxpg.mqtt_relay.id IS 'Relay position; a NOTIFY announces the id range of one committed batch';
COMMENT ON COLUMN fluxpg.mqtt_relay.node_id IS 'fluxpg.nodes.id of the node the publisher is connected to (that node delivered locally already)';
COMMENT ON COLUMN fluxpg.mqtt_relay.origin IS 'MQTT client id of the publisher (for the no-local subscription option)';
COMMENT ON COLUMN fluxpg.mqtt_relay.topic IS 'Topic name the message was published to';
COMMENT ON COLUMN fluxpg.mqtt_relay.payload IS 'Application message payload';
COMMENT ON COLUMN fluxpg.mqtt_relay.qos IS 'QoS the message was published with (0, 1 or 2)';
COMMENT ON COLUMN fluxpg.mqtt_relay.retain IS 'RETAIN flag as published (for retain-as-published subscriptions)';
COMMENT ON COLUMN fluxpg.mqtt_relay.props IS 'MQTT 5 properties forwarded to subscribers: content_type, response_topic, correlation_data (base64), payload_format_indicator, user_properties';
COMMENT ON COLUMN fluxpg.mqtt_relay.expires_at IS 'Publish time + message expiry interval; NULL = never expires';
COMMENT ON COLUMN fluxpg.mqtt_relay.created_at IS 'When the row was written (rows older than a minute are deleted by their node)';

-- Retained messages: one row per topic, shared by every node, surviving restarts.
CREATE TABLE fluxpg.mqtt_retained (
    topic      text PRIMARY KEY,
    payload    bytea NOT NULL,
    qos        smallint NOT NULL CHECK (qos BETWEEN 0 AND 2),
    props      jsonb,
    expires_at timestamptz,
    node_id    int,
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- Prefix scans for subscriptions like `sensors/+/temp` (topic LIKE 'sensors/%').
CREATE INDEX mqtt_retained_topic_prefix ON fluxpg.mqtt_retained (topic text_pattern_ops);
COMMENT ON TABLE fluxpg.mqtt_retained IS 'MQTT retained messages, the last retained PUBLISH per topic (an empty retained payload deletes the row)';
COMMENT ON COLUMN fluxpg.mqtt_retained.topic IS 'Topic name';
COMMENT ON COLUMN fluxpg.mqtt_retained.payload IS 'Payload of the last retained message on the topic (never empty)';
COMMENT ON COLUMN fluxpg.mqtt_retained.qos IS 'QoS it was published with; a new subscriber gets min(this, its subscription QoS)';
COMMENT ON COLUMN fluxpg.mqtt_retained.props IS 'MQTT 5 properties kept with it (same format as mqtt_relay.props)';
COMMENT ON COLUMN fluxpg.mqtt_retained.expires_at IS 'Publish time + message expiry interval; NULL = never; expired rows are not sent and are deleted';
COMMENT ON COLUMN fluxpg.mqtt_retained.node_id IS 'fluxpg.nodes.id of the node that stored it (informational)';
COMMENT ON COLUMN fluxpg.mqtt_retained.updated_at IS 'When it was last set';
