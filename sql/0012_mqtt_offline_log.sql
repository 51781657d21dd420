-- Offline messages of persistent MQTT sessions through a shared log (migration 0012_mqtt_offline_log,
-- issue 16). A message published on a plain topic that matches at least one OFFLINE persistent
-- session is appended once to the stream of the node that owns those sessions, whatever the number
-- of sessions; each offline session keeps a cursor range into that stream and its subscriptions
-- (fluxpg.mqtt_session_subscriptions), and replays the matching rows when it reconnects. A burst
-- for N offline devices writes 1 row per message instead of N (benchmarks/README.md).
--
-- Streams are per node (node ids are per process): only the owner of a session routes messages to
-- it, so a session reads the stream of each node that held it while offline -- several when it was
-- adopted after a crash or moved by a takeover -- each between its cursor and `until_seq`.
-- In-flight QoS 1/2 state stays one row per session per message (fluxpg.mqtt_session_messages):
-- a replayed message becomes such a row, and moves the cursor, in one statement when it is sent.
--
-- Retention: rows at or below the lowest cursor of their node's stream (or of a stream no cursor
-- reads) are deleted by the MQTT housekeeping of any node. Rows, not partitions: the table holds
-- only the undelivered backlog (one row per message, pruned every few seconds), so a DELETE costs
-- what the appends cost; partitions per node stream are the step if that stops being true.

CREATE TABLE fluxpg.mqtt_offline_log (
    node_id     int NOT NULL,
    seq         bigint NOT NULL,
    topic       text NOT NULL,
    payload     bytea NOT NULL,
    qos         smallint NOT NULL CHECK (qos BETWEEN 1 AND 2),
    retain      boolean NOT NULL DEFAULT false,
    props       jsonb,
    expires_at  timestamptz,
    origin      text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node_id, seq)
);
COMMENT ON TABLE fluxpg.mqtt_offline_log IS 'Plain-topic MQTT messages kept for offline persistent sessions: one row per message per owner node, read through fluxpg.mqtt_offline_cursors';
COMMENT ON COLUMN fluxpg.mqtt_offline_log.node_id IS 'fluxpg.nodes.id of the node that appended it (the owner of the offline sessions it matched)';
COMMENT ON COLUMN fluxpg.mqtt_offline_log.seq IS 'Position in that node''s stream (appends commit in seq order: one writer per node)';
COMMENT ON COLUMN fluxpg.mqtt_offline_log.topic IS 'Topic name';
COMMENT ON COLUMN fluxpg.mqtt_offline_log.payload IS 'Payload';
COMMENT ON COLUMN fluxpg.mqtt_offline_log.qos IS 'QoS as published (a session gets the minimum of this and its subscription''s)';
COMMENT ON COLUMN fluxpg.mqtt_offline_log.retain IS 'RETAIN flag as published (forwarded only to retain-as-published subscriptions)';
COMMENT ON COLUMN fluxpg.mqtt_offline_log.props IS 'MQTT 5 properties forwarded (same format as mqtt_relay.props)';
COMMENT ON COLUMN fluxpg.mqtt_offline_log.expires_at IS 'Message expiry; NULL = never';
COMMENT ON COLUMN fluxpg.mqtt_offline_log.origin IS 'Publisher''s client id (no local)';
COMMENT ON COLUMN fluxpg.mqtt_offline_log.created_at IS 'When it was appended';

CREATE TABLE fluxpg.mqtt_offline_cursors (
    id          bigserial PRIMARY KEY,
    client_id   text NOT NULL REFERENCES fluxpg.mqtt_sessions (client_id) ON DELETE CASCADE,
    node_id     int NOT NULL,
    cursor      bigint NOT NULL,
    until_seq   bigint
);
CREATE INDEX mqtt_offline_cursors_client ON fluxpg.mqtt_offline_cursors (client_id);
CREATE INDEX mqtt_offline_cursors_node ON fluxpg.mqtt_offline_cursors (node_id, cursor);
COMMENT ON TABLE fluxpg.mqtt_offline_cursors IS 'Where each offline persistent MQTT session is in the node streams of fluxpg.mqtt_offline_log (deleted with the session)';
COMMENT ON COLUMN fluxpg.mqtt_offline_cursors.id IS 'Order of the ranges of one session (older first)';
COMMENT ON COLUMN fluxpg.mqtt_offline_cursors.client_id IS 'Session (fluxpg.mqtt_sessions.client_id)';
COMMENT ON COLUMN fluxpg.mqtt_offline_cursors.node_id IS 'Stream (fluxpg.mqtt_offline_log.node_id) this range reads';
COMMENT ON COLUMN fluxpg.mqtt_offline_cursors.cursor IS 'Last seq of the stream delivered (made an in-flight row) or dropped for the session';
COMMENT ON COLUMN fluxpg.mqtt_offline_cursors.until_seq IS 'Last seq that belongs to the session (it reconnected or moved then); NULL = open, the node still owns the offline session';

ALTER TABLE fluxpg.mqtt_sessions ADD COLUMN offline_dropped bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN fluxpg.mqtt_sessions.offline_dropped IS 'Offline messages dropped (oldest first) above bounds.mqtt_session_outbound_messages / _bytes, in total';
