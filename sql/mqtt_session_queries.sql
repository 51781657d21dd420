-- Named queries of durable MQTT sessions (fluxpg/queues/mqtt_sessions.py; tables in
-- sql/0009_mqtt_sessions.sql). Each starts with `-- name: x`.

-- name: session_upsert
-- A persistent session attached to a connection at node $2 (CONNECT).
INSERT INTO fluxpg.mqtt_sessions AS s (client_id, node_id, connected, expiry_interval, protocol_level,
                                       will, will_payload, disconnected_at)
VALUES ($1, $2, true, $3, $4, $5::jsonb, $6, NULL)
ON CONFLICT (client_id) DO UPDATE
   SET node_id = excluded.node_id, connected = true, expiry_interval = excluded.expiry_interval,
       protocol_level = excluded.protocol_level, will = excluded.will, will_payload = excluded.will_payload,
       disconnected_at = NULL, updated_at = now();

-- name: session_disconnected
UPDATE fluxpg.mqtt_sessions
   SET connected = false, disconnected_at = now(), expiry_interval = $2, will = NULL, will_payload = NULL,
       updated_at = now()
 WHERE client_id = $1;

-- name: session_delete
DELETE FROM fluxpg.mqtt_sessions WHERE client_id = $1;

-- name: session_release
-- The owner hands the session over (takeover by another node): the new node claims it.
UPDATE fluxpg.mqtt_sessions SET node_id = $2, updated_at = now() WHERE client_id = $1;

-- name: session_owner
-- Who owns the session and whether that node is alive.
SELECT s.node_id, (n.id IS NOT NULL) AS alive, n.host, n.pid
  FROM fluxpg.mqtt_sessions s
  LEFT JOIN fluxpg.nodes n ON n.id = s.node_id AND n.last_seen_at > now() - $2::interval
 WHERE s.client_id = $1;

-- name: session_notify
-- Ask the owner node of a session to hand it over: payload '<owner>:<new node>:<client id>'.
SELECT pg_notify('fluxpg_mqtt_session', $1::int::text || ':' || $2::int::text || ':' || $3);

-- name: node_process
SELECT host, pid FROM fluxpg.nodes WHERE id = $1;

-- name: session_adopt
-- Sessions whose owner is gone (a crash, a restart: node ids are per process) move to node $1.
-- Returns what the adopter needs to restore them, including whether a connection was attached
-- when the owner died (its will is due).
-- $3: ids of nodes known dead although their heartbeat is recent (same host, process gone).
UPDATE fluxpg.mqtt_sessions s
   SET node_id = $1, updated_at = now()
 WHERE s.node_id IS DISTINCT FROM $1
   AND (s.node_id = ANY($3::int[])
        OR NOT EXISTS (SELECT 1 FROM fluxpg.nodes n
                        WHERE n.id = s.node_id AND n.last_seen_at > now() - $2::interval))
RETURNING s.client_id;

-- name: local_nodes
-- Other nodes registered from this host (their pids are checked by the caller).
SELECT id, pid FROM fluxpg.nodes WHERE host = $1 AND id <> $2;

-- name: session_load
SELECT client_id, node_id, connected, expiry_interval, protocol_level, will, will_payload,
       extract(epoch FROM now() - coalesce(disconnected_at, now()))::float8 AS offline_for
  FROM fluxpg.mqtt_sessions WHERE client_id = $1;

-- name: session_subscriptions
SELECT topic_filter, qos, no_local, retain_as_published, retain_handling, subscription_id, queue_group
  FROM fluxpg.mqtt_session_subscriptions WHERE client_id = $1 ORDER BY topic_filter;

-- name: session_messages
SELECT key, packet_id, stage, topic, payload, qos, retain, props::text AS props, expires_at, sub_ids
  FROM fluxpg.mqtt_session_messages WHERE client_id = $1 ORDER BY key;

-- name: session_inbound
SELECT packet_id FROM fluxpg.mqtt_session_inbound WHERE client_id = $1;

-- name: session_expired
-- Offline sessions past their expiry, on any node (the owner's timer normally gets there first).
DELETE FROM fluxpg.mqtt_sessions
 WHERE NOT connected AND expiry_interval < 4294967295
   AND disconnected_at + expiry_interval * interval '1 second' < now()
RETURNING client_id;

-- name: sub_upsert
INSERT INTO fluxpg.mqtt_session_subscriptions AS s
       (client_id, topic_filter, qos, no_local, retain_as_published, retain_handling, subscription_id, queue_group)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (client_id, topic_filter) DO UPDATE
   SET qos = excluded.qos, no_local = excluded.no_local, retain_as_published = excluded.retain_as_published,
       retain_handling = excluded.retain_handling, subscription_id = excluded.subscription_id,
       queue_group = excluded.queue_group;

-- name: sub_delete
DELETE FROM fluxpg.mqtt_session_subscriptions WHERE client_id = $1 AND topic_filter = $2;

-- name: msg_insert
INSERT INTO fluxpg.mqtt_session_messages
       (client_id, key, packet_id, stage, topic, payload, qos, retain, props, expires_at, sub_ids)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::text::jsonb, $10, $11)
ON CONFLICT (client_id, key) DO NOTHING;

-- name: msg_stage
UPDATE fluxpg.mqtt_session_messages SET packet_id = $3, stage = $4 WHERE client_id = $1 AND key = $2;

-- name: msg_delete
DELETE FROM fluxpg.mqtt_session_messages WHERE client_id = $1 AND key = $2;

-- name: inbound_add
INSERT INTO fluxpg.mqtt_session_inbound (client_id, packet_id) VALUES ($1, $2) ON CONFLICT DO NOTHING;

-- name: inbound_delete
DELETE FROM fluxpg.mqtt_session_inbound WHERE client_id = $1 AND packet_id = $2;
