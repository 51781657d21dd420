-- Named queries the broker runs (loaded by fluxpg.db.queries()). Each starts with `-- name: x`.

-- name: load_queues
SELECT id, name, kind, topics, partitions, segment_size, settings FROM fluxpg.queues ORDER BY id;

-- name: declare_queue
SELECT fluxpg.declare_queue($1, $2, $3::text[], $4::jsonb);

-- name: append_batch
SELECT ord, queue_id, partition, seq
  FROM fluxpg.append_batch($1::int[], $2::text[], $3::bytea[], $4::jsonb[], $5::text[]);

-- name: claim
SELECT queue, grp, partition, seq, topic, payload, headers, created_at, delivery_count
  FROM fluxpg.claim($1, $2, $3, $4);

-- name: read
SELECT queue, grp, partition, seq, topic, payload, headers, created_at, delivery_count
  FROM fluxpg.read($1, $2, $3, $4);

-- name: reclaim
SELECT queue, grp, partition, seq, topic, payload, headers, created_at, delivery_count
  FROM fluxpg.reclaim($1, $2, $3, $4);

-- name: claim_stale
SELECT queue, grp, partition, seq, topic, payload, headers, created_at, delivery_count
  FROM fluxpg.claim_stale($1, $2, $3, $4::interval, $5);

-- name: ack
SELECT fluxpg.ack($1, $2, $3::bigint[], $4);

-- name: nack
SELECT fluxpg.nack($1, $2, $3::bigint[], $4);

-- name: reject
SELECT fluxpg.reject($1, $2, $3::bigint[], $4, $5);

-- name: commit
SELECT fluxpg.commit($1, $2, $3, $4);

-- name: seek
SELECT fluxpg.seek($1, $2, $3);

-- name: configure_group
SELECT fluxpg.configure_group($1, $2, $3);

-- name: ensure_group
SELECT g.auto_commit FROM fluxpg._group(fluxpg._queue($1), $2) g;

-- name: ensure_dlq
SELECT fluxpg._dlq_queue(fluxpg._queue($1));

-- name: join_group
SELECT fluxpg.join_group($1, $2, $3);

-- name: member_heartbeat
SELECT fluxpg.heartbeat($1, $2, $3);

-- name: leave_group
SELECT fluxpg.leave($1, $2, $3);

-- name: expire_groups
SELECT fluxpg.expire_groups();

-- name: group_committed
SELECT c.committed
  FROM fluxpg.cursors c JOIN fluxpg.groups g ON g.id = c.group_id
 WHERE g.queue_id = $1 AND g.name = $2 AND c.partition = $3;

-- name: register_node
SELECT fluxpg.register_node($1, $2);

-- name: node_heartbeat
SELECT fluxpg.node_heartbeat($1, $2::interval);

-- name: deregister_node
DELETE FROM fluxpg.nodes WHERE id = $1;

-- name: due_segments
SELECT queue_id, queue, partition, segment::text AS segment, from_seq, to_seq, reason
  FROM fluxpg.due_segments() ORDER BY queue_id, partition, from_seq;

-- name: detach_pending_segments
SELECT parent.oid::regclass::text AS parent, c.oid::regclass::text AS segment
  FROM pg_inherits i
  JOIN pg_class parent ON parent.oid = i.inhparent
  JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhdetachpending AND parent.relnamespace = 'fluxpg'::regnamespace;

-- name: forget_segment
SELECT fluxpg._forget_segment($1, $2);

-- name: queue_stats
SELECT queue, kind, partitions, head, depth, bytes, segments, oldest_at, topics, groups
  FROM fluxpg.queue_stats;

-- name: group_status
SELECT queue, grp, mode, partition, cursor, committed, lag, pending, oldest_pending_age, filter,
       auto_commit, consumers, last_active_at
  FROM fluxpg.group_status WHERE queue = $1;

-- name: pending_entries
SELECT queue, grp, partition, seq, consumer, idle, delivery_count, visible_at, message_id
  FROM fluxpg.pending_entries WHERE queue = $1 AND grp = $2 LIMIT $3;

-- name: outbox_publish
SELECT queue FROM fluxpg.publish($1, $2, CAST(CAST($3 AS text) AS jsonb));

-- name: outbox_publish_batch
SELECT ord, queue FROM fluxpg.publish_batch(CAST($1 AS text[]), CAST($2 AS bytea[]), CAST(CAST($3 AS text[]) AS jsonb[]));
