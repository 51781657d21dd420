-- Named queries of the MQTT front-end (loaded by fluxpg.protocols.mqtt.router.mqtt_queries()).
-- Each starts with `-- name: x`, like sql/queries.sql.

-- name: relay_insert
-- One batch in one statement; the NOTIFY is delivered at commit, so readers see the rows.
WITH ins AS (
    INSERT INTO fluxpg.mqtt_relay (node_id, origin, topic, payload, qos, retain, props, expires_at, seq)
    SELECT $1::int, u.origin, u.topic, u.payload, u.qos, u.retain, u.props::jsonb, u.expires_at, u.seq
      FROM unnest($2::text[], $3::text[], $4::bytea[], $5::smallint[], $6::bool[], $7::text[],
                  $8::timestamptz[], $9::bigint[]) WITH ORDINALITY
           AS u(origin, topic, payload, qos, retain, props, expires_at, seq, ord)
     ORDER BY u.ord
    RETURNING id)
SELECT pg_notify('fluxpg_mqtt', $1::int::text || ':' || min(id)::text || ':' || max(id)::text)
  FROM ins HAVING count(*) > 0;

-- name: relay_range
SELECT origin, topic, payload, qos, retain, props::text AS props, expires_at, seq
  FROM fluxpg.mqtt_relay
 WHERE id BETWEEN $1 AND $2 AND node_id = $3
 ORDER BY id;

-- name: relay_prune
DELETE FROM fluxpg.mqtt_relay WHERE node_id = $1 AND created_at < now() - $2::interval;

-- name: remote_nodes
SELECT count(*) FROM fluxpg.nodes WHERE id <> $1 AND last_seen_at > now() - $2::interval;

-- name: retain_set
INSERT INTO fluxpg.mqtt_retained AS r (topic, payload, qos, props, expires_at, node_id)
VALUES ($1, $2, $3, $4::text::jsonb, $5, $6)
ON CONFLICT (topic) DO UPDATE
   SET payload = excluded.payload, qos = excluded.qos, props = excluded.props,
       expires_at = excluded.expires_at, node_id = excluded.node_id, updated_at = now();

-- name: retain_clear
DELETE FROM fluxpg.mqtt_retained WHERE topic = $1;

-- name: retained_prefix
-- Candidates for a subscription filter: topics starting with its literal prefix (LIKE pattern
-- built and escaped by the caller); the caller applies MQTT matching to them.
SELECT topic, payload, qos, props::text AS props, expires_at
  FROM fluxpg.mqtt_retained
 WHERE topic LIKE $1 AND (expires_at IS NULL OR expires_at > now())
 ORDER BY topic;

-- name: retained_prune
DELETE FROM fluxpg.mqtt_retained WHERE expires_at < now();

-- name: shared_set
-- This node's member count of one shared group; the first member inserts the row (the trigger
-- NOTIFYs fluxpg_mqtt_shared), later counts only update it.
INSERT INTO fluxpg.mqtt_shared AS s (share_group, filter, node_id, members)
VALUES ($1, $2, $3, $4)
ON CONFLICT (share_group, filter, node_id) DO UPDATE
   SET members = excluded.members, updated_at = now()
 WHERE s.members <> excluded.members;

-- name: shared_clear
-- The node's last member of the group left (the trigger NOTIFYs fluxpg_mqtt_shared).
DELETE FROM fluxpg.mqtt_shared WHERE share_group = $1 AND filter = $2 AND node_id = $3;

-- name: shared_clear_node
DELETE FROM fluxpg.mqtt_shared WHERE node_id = $1;

-- name: shared_nodes
-- Every live node's shared groups (a node silent for the heartbeat timeout no longer counts, even
-- before node_heartbeat deletes it and its rows); loaded into memory by each node.
SELECT s.share_group, s.filter, array_agg(s.node_id ORDER BY s.node_id) AS nodes
  FROM fluxpg.mqtt_shared s JOIN fluxpg.nodes n ON n.id = s.node_id
 WHERE n.last_seen_at > now() - $1::interval
 GROUP BY s.share_group, s.filter;
