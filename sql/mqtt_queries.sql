-- Named queries of the MQTT front-end (loaded by fluxpg.protocols.mqtt.router.mqtt_queries()).
-- Each starts with `-- name: x`, like sql/queries.sql.

-- name: relay_insert
-- One batch in one statement; the NOTIFY is delivered at commit, so readers see the rows.
WITH ins AS (
    INSERT INTO fluxpg.mqtt_relay (node_id, origin, topic, payload, qos, retain, props, expires_at)
    SELECT $1::int, u.origin, u.topic, u.payload, u.qos, u.retain, u.props::jsonb, u.expires_at
      FROM unnest($2::text[], $3::text[], $4::bytea[], $5::smallint[], $6::bool[], $7::text[],
                  $8::timestamptz[]) WITH ORDINALITY
           AS u(origin, topic, payload, qos, retain, props, expires_at, ord)
     ORDER BY u.ord
    RETURNING id)
SELECT pg_notify('fluxpg_mqtt', $1::int::text || ':' || min(id)::text || ':' || max(id)::text)
  FROM ins HAVING count(*) > 0;

-- name: relay_range
SELECT origin, topic, payload, qos, retain, props::text AS props, expires_at
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
