-- Named queries of the shared offline log of persistent MQTT sessions (fluxpg/queues/mqtt_sessions.py,
-- driven by fluxpg/protocols/mqtt/session.py; tables in sql/0012_mqtt_offline_log.sql). They run in
-- the session store's ordered write-through, so an append commits with (or after) the cursor that
-- makes it readable, and a take with the cursor move it implies.

-- name: offline_append
-- One message for the offline sessions of node $1 (however many matched it).
INSERT INTO fluxpg.mqtt_offline_log (node_id, seq, topic, payload, qos, retain, props, expires_at, origin)
VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8, $9)
ON CONFLICT (node_id, seq) DO NOTHING;

-- name: cursor_open
-- Session $1 went offline on node $2 whose stream is at $3: it needs what comes after. Nothing if
-- the session row is gone (expired or ended meanwhile).
INSERT INTO fluxpg.mqtt_offline_cursors (client_id, node_id, cursor)
SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM fluxpg.mqtt_sessions WHERE client_id = $1);

-- name: cursor_close
-- Session $1 is no longer offline on node $2 (it reconnected there, or moved): its range of that
-- stream ends at $3.
UPDATE fluxpg.mqtt_offline_cursors SET until_seq = $3
 WHERE client_id = $1 AND node_id = $2 AND until_seq IS NULL;

-- name: cursor_advance
-- Offline above the bound: the oldest messages up to $3 of the open range are dropped ($4 of them).
WITH s AS (UPDATE fluxpg.mqtt_sessions SET offline_dropped = offline_dropped + $4 WHERE client_id = $1)
UPDATE fluxpg.mqtt_offline_cursors SET cursor = greatest(cursor, $3)
 WHERE client_id = $1 AND node_id = $2 AND until_seq IS NULL;

-- name: cursors_clear
-- Every replayed message of session $1 is an in-flight row now (or was dropped): the ranges are done.
DELETE FROM fluxpg.mqtt_offline_cursors WHERE client_id = $1;

-- name: session_dropped
UPDATE fluxpg.mqtt_sessions SET offline_dropped = offline_dropped + $2 WHERE client_id = $1;

-- name: log_take
-- A replayed message becomes the session's in-flight (or queued) row and the range's cursor moves
-- past it, in one statement: a crash leaves either both or neither (never lost, never twice).
WITH c AS (UPDATE fluxpg.mqtt_offline_cursors SET cursor = greatest(cursor, $13) WHERE id = $12)
INSERT INTO fluxpg.mqtt_session_messages
       (client_id, key, packet_id, stage, topic, payload, qos, retain, props, expires_at, sub_ids)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::text::jsonb, $10, $11)
ON CONFLICT (client_id, key) DO NOTHING;

-- name: session_cursors
SELECT id, node_id, cursor, until_seq FROM fluxpg.mqtt_offline_cursors WHERE client_id = $1 ORDER BY id;

-- name: offline_page
SELECT seq, topic, payload, qos, retain, props::text AS props, expires_at, origin
  FROM fluxpg.mqtt_offline_log
 WHERE node_id = $1 AND seq > $2 AND seq <= $3
 ORDER BY seq
 LIMIT $4;

-- name: offline_head
-- The last seq of node $1's stream (this node's counter starts there).
SELECT coalesce(max(seq), 0) FROM fluxpg.mqtt_offline_log WHERE node_id = $1;

-- name: offline_prune
-- Rows no session needs: at or below the lowest cursor of their stream, or in a stream no cursor
-- reads. Any node may run it (a cursor only ever moves forward, new ones start at their stream's
-- head, so what one snapshot finds unneeded stays unneeded).
WITH floors AS (SELECT node_id, min(cursor) AS floor FROM fluxpg.mqtt_offline_cursors GROUP BY node_id)
DELETE FROM fluxpg.mqtt_offline_log l
 WHERE l.seq <= coalesce((SELECT f.floor FROM floors f WHERE f.node_id = l.node_id), 9223372036854775807);

-- name: cursors_compact
-- A dormant session (offline, never coming back, never expiring) would hold every row appended
-- after its cursor, matching or not. Move the $1 lowest ranges (those holding retention back)
-- to just before their session's next matching row -- a subscription of QoS 1/2 that is not
-- shared and not no-local for the row's publisher, as the replay decides -- or to the end of
-- what they read. Never backwards (greatest): the owner may move a cursor meanwhile.
WITH streams AS (
    SELECT n.node_id, (SELECT max(l.seq) FROM fluxpg.mqtt_offline_log l WHERE l.node_id = n.node_id) AS head
      FROM (SELECT DISTINCT node_id FROM fluxpg.mqtt_offline_cursors) n),
pick AS (
    SELECT c.id, c.client_id, c.node_id, c.cursor, least(coalesce(c.until_seq, s.head), s.head) AS upto
      FROM fluxpg.mqtt_offline_cursors c JOIN streams s USING (node_id)
     WHERE c.cursor < least(coalesce(c.until_seq, s.head), s.head)
     ORDER BY c.cursor
     LIMIT $1),
next AS (
    SELECT p.id, coalesce(
             (SELECT min(l.seq) - 1 FROM fluxpg.mqtt_offline_log l
               WHERE l.node_id = p.node_id AND l.seq > p.cursor AND l.seq <= p.upto
                 AND EXISTS (SELECT 1 FROM fluxpg.mqtt_session_subscriptions s
                              WHERE s.client_id = p.client_id AND s.queue_group IS NULL AND s.qos > 0
                                AND s.topic_filter NOT LIKE '$share/%'
                                AND NOT (s.no_local AND l.origin = p.client_id)
                                AND fluxpg.topic_matches(s.topic_filter, l.topic))),
             p.upto) AS cursor
      FROM pick p)
UPDATE fluxpg.mqtt_offline_cursors c SET cursor = greatest(c.cursor, n.cursor)
  FROM next n
 WHERE c.id = n.id AND n.cursor > c.cursor;

-- name: log_take_row
-- log_take without the cursor move: the session store inserts a run of takes with this and then
-- moves each range's cursor once (cursor_move), in the same transaction -- updating one cursor
-- row per message made every take of a run walk a longer chain of row versions.
INSERT INTO fluxpg.mqtt_session_messages
       (client_id, key, packet_id, stage, topic, payload, qos, retain, props, expires_at, sub_ids)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::text::jsonb, $10, $11)
ON CONFLICT (client_id, key) DO NOTHING;

-- name: cursor_move
UPDATE fluxpg.mqtt_offline_cursors SET cursor = greatest(cursor, $2) WHERE id = $1;
