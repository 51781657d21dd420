-- Named queries the broker runs (loaded by fluxpg.db.queries()). Each starts with `-- name: x`.

-- name: load_queues
SELECT id, name, kind, topics, partitions, segment_size, settings, durability, owner, auto_delete, owner_node
  FROM fluxpg.queues ORDER BY id;

-- name: load_queue
SELECT id, name, kind, topics, partitions, segment_size, settings, durability, owner, auto_delete, owner_node
  FROM fluxpg.queues WHERE id = $1;

-- name: declare_transient
SELECT fluxpg.declare_transient($1, $2, $3, $4, $5::jsonb);

-- name: delete_transient
SELECT fluxpg.delete_transient($1);

-- name: release
SELECT fluxpg.release($1, $2, $3::bigint[], $4);

-- name: dead_letter_expired
SELECT fluxpg.dead_letter_expired();

-- name: sweep_transient
SELECT fluxpg.sweep_transient();

-- name: ready_count
SELECT fluxpg.ready_count($1);

-- name: queue_depth
SELECT depth, consumers FROM fluxpg.queue_stats WHERE queue = $1;

-- name: declare_queue
SELECT fluxpg.declare_queue($1, $2, $3::text[], $4::jsonb);

-- name: declare_queue_if_absent
-- Auto-creation: a queue declared meanwhile, anywhere, is returned as it is (not reset to these settings).
SELECT fluxpg.declare_queue($1, $2, $3::text[], $4::jsonb, if_absent => true);

-- name: append_batch
SELECT ord, queue_id, partition, seq
  FROM fluxpg.append_batch($1::int[], $2::text[], $3::bytea[], $4::jsonb[], $5::text[], $6::text);

-- name: append_claim
SELECT r_target, r_ord, r_queue_id, r_partition, r_seq, r_topic, r_payload, r_headers, r_created_at, r_delivery_count
  FROM fluxpg.append_claim($1::int[], $2::text[], $3::bytea[], $4::jsonb[], $5::text[], $6::text[], $7::text[],
                           $8::text[], $9::int[], $10::int[], $11::bigint[], $12::text);

-- name: sequence_claim
-- fluxpg.sequence_claim commits asynchronously (why: at the function).
-- Rows as append_claim's (r_ord NULL), so the handoff reads both alike.
SELECT r_target, NULL::int AS r_ord, r_queue_id, r_partition, r_seq, r_topic, r_payload, r_headers, r_created_at,
       r_delivery_count
  FROM fluxpg.sequence_claim($1, $2::text[], $3::text[], $4::text[], $5::int[], $6::text);

-- name: sequencer_sleep_lock
-- An idle sequencer's lock: while it holds it, publishing commits NOTIFY fluxpg_outbox (the
-- trigger fluxpg._outbox_commit); not granted while a publishing commit is under way.
SELECT pg_try_advisory_lock(1179669332, -1);

-- name: sequencer_sleep_unlock
SELECT pg_advisory_unlock(1179669332, -1);

-- name: sequencer_asleep_elsewhere
-- The sleep lock is held exclusively, i.e. by another node's sleeping sequencer (publishing
-- commits hold it shared): publishing commits NOTIFY until it wakes, and every node hears it.
-- In this database only: advisory locks are per database, and pg_locks shows the whole server's.
-- A sequencer asleep in another fluxpg database of the server, seen here, made this one sleep
-- without the lock while its own commits, finding no holder, sent no NOTIFY: each transactional
-- publish then waited for IDLE_POLL (end-to-end p50 ~400 ms at 1,000 msg/s in benchmarks run
-- while other fluxpg databases on the server were idle).
SELECT EXISTS (SELECT 1 FROM pg_locks
                WHERE locktype = 'advisory' AND classid = 1179669332 AND objid = 4294967295 AND objsubid = 2
                  AND mode = 'ExclusiveLock' AND granted
                  AND database = (SELECT oid FROM pg_database WHERE datname = current_database()));

-- name: classic_cursor_behind
-- A classic group's cursor on partition 0 and whether the queue's head is beyond it (a filtered
-- claim that came back short may only have reached the end of its window).
SELECT c.cursor, c.cursor < h.next_seq
  FROM fluxpg.cursors c
  JOIN fluxpg.groups g ON g.id = c.group_id
  JOIN fluxpg.queues q ON q.id = g.queue_id
  JOIN fluxpg.heads h ON h.queue_id = q.id AND h.partition = c.partition
 WHERE q.name = $1 AND g.name = $2 AND c.partition = 0;

-- name: claim
SELECT queue, grp, partition, seq, topic, payload, headers, created_at, delivery_count
  FROM fluxpg.claim($1, $2, $3, $4, $5::jsonpath);

-- name: ack_claim
SELECT queue, grp, partition, seq, topic, payload, headers, created_at, delivery_count
  FROM fluxpg.ack_claim($1, $2, $3::bigint[], $4, $5);

-- name: read
SELECT queue, grp, partition, seq, topic, payload, headers, created_at, delivery_count
  FROM fluxpg.read($1, $2, $3, $4);

-- name: reclaim
SELECT queue, grp, partition, seq, topic, payload, headers, created_at, delivery_count
  FROM fluxpg.reclaim($1, $2, $3, $4, $5);

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

-- name: node_watches
SELECT fluxpg._node_watches($1, $2::int[]);

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
SELECT queue, kind, partitions, head, depth, bytes, segments, oldest_at, topics, groups, consumers
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

-- ---------------------------------------------------------------------------------------------
-- Admin and console (fluxpg/queues/admin.py): not on the hot path. Long lists are paged by
-- keyset (WHERE offset >= last seen, ORDER BY, LIMIT): one index range scan per page, as fast for
-- a queue of 10 million messages as for one of 10.
-- ---------------------------------------------------------------------------------------------

-- name: ping
SELECT 1;

-- name: queue_id
SELECT id FROM fluxpg.queues WHERE name = $1;

-- name: all_group_status
SELECT queue, grp, mode, partition, cursor, committed, lag, pending, oldest_pending_age, filter,
       auto_commit, consumers, last_active_at
  FROM fluxpg.group_status;

-- name: queue_rows
SELECT q.name, CASE WHEN q.durability = 'transient' THEN 'transient' ELSE q.kind END AS kind,
       q.partitions, q.settings, q.created_at,
       (SELECT count(*) FROM fluxpg.members m JOIN fluxpg.groups g ON g.id = m.group_id
         WHERE g.queue_id = q.id)::int AS consumers
  FROM fluxpg.queues q ORDER BY q.name;

-- name: queue_counters
SELECT q.name AS queue, (SELECT sum(h.next_seq) FROM fluxpg.heads h WHERE h.queue_id = q.id)::bigint AS appended,
       (SELECT coalesce(sum(c.cursor), 0) FROM fluxpg.cursors c JOIN fluxpg.groups g ON g.id = c.group_id
         WHERE g.queue_id = q.id)::bigint AS delivered
  FROM fluxpg.queues q;

-- name: queue_bounds
SELECT h.partition, h.first_seq, h.next_seq
  FROM fluxpg.heads h JOIN fluxpg.queues q ON q.id = h.queue_id
 WHERE q.name = $1 ORDER BY h.partition;

-- name: browse
-- $7 bounds the scan from above so that only the segments holding the page are opened (a lower
-- bound alone makes the plan start an index scan in every segment of the queue).
SELECT l.partition, l.seq, l.topic, substring(l.payload FROM 1 FOR $5) AS payload,
       octet_length(l.payload) AS size, l.headers, l.created_at, l.expires_at,
       EXISTS (SELECT 1 FROM fluxpg.redriven r
                WHERE r.queue_id = l.queue_id AND r.partition = l.partition AND r.seq = l.seq) AS redriven
  FROM fluxpg.log l
 WHERE l.queue_id = $1 AND l.partition = $2 AND l.seq >= $3 AND l.seq < $7
   AND ($6 OR NOT EXISTS (SELECT 1 FROM fluxpg.redriven r
                           WHERE r.queue_id = l.queue_id AND r.partition = l.partition AND r.seq = l.seq))
 ORDER BY l.seq
 LIMIT $4;

-- name: offset_at
SELECT fluxpg.offset_at($1, $2, $3);

-- name: pending_page
SELECT partition, seq, consumer, idle, delivery_count, delivered_at, visible_at, message_id
  FROM fluxpg.pending_entries
 WHERE queue = $1 AND grp = $2 AND (partition, seq) >= ($3, $4)
 ORDER BY partition, seq
 LIMIT $5;

-- name: nodes
SELECT id, host, pid, started_at, last_seen_at FROM fluxpg.nodes ORDER BY id;

-- name: redrive
SELECT fluxpg.redrive($1, $2::bigint[], $3, $4, $5);

-- name: delete_group
SELECT fluxpg.delete_group($1, $2);

-- name: reset_group
SELECT fluxpg.reset_group($1, $2, $3);

-- name: purge_queue
SELECT fluxpg.purge_queue($1);

-- name: delete_queue
SELECT fluxpg.delete_queue($1, $2, $3, $4::interval);

-- name: report_connections
SELECT fluxpg.report_connections($1, $2::jsonb);

-- name: all_connections
SELECT node_id, id, protocol, listener, peer, client_id, username, since
  FROM fluxpg.connections ORDER BY node_id, id;

-- name: request_close
-- The node that holds the connection LISTENs on fluxpg_close (fluxpg/queues/connection_sync.py).
SELECT pg_notify('fluxpg_close', $1::int || ':' || $2::bigint);

-- name: resolve_group
SELECT fluxpg.resolve_group($1, $2);

-- name: retire_reserved
SELECT fluxpg.retire_reserved($1::text[]);

-- Command line (fluxpg/cli.py): inspection and tail read the tables directly, claiming nothing.

-- name: cli_queue
SELECT id, kind, partitions FROM fluxpg.queues WHERE name = $1;

-- name: cli_append
SELECT queue, seq FROM fluxpg.append($1, $2, $3);

-- name: cli_heads
SELECT partition, first_seq, next_seq FROM fluxpg.heads WHERE queue_id = $1 ORDER BY partition;

-- name: cli_group_committed
SELECT partition, committed FROM fluxpg.group_status WHERE queue = $1 AND grp = $2;

-- name: cli_watch_log
SELECT fluxpg.watch_log($1, NULL, make_interval(secs => $2));

-- name: cli_unwatch_log
SELECT fluxpg.unwatch_log($1);

-- name: cli_log_page
SELECT partition, seq, topic, payload, created_at FROM fluxpg.log
 WHERE queue_id = $1 AND partition = $2 AND seq >= $3 ORDER BY seq LIMIT $4;

-- name: retention_leader
-- Session-level: held by the retention loop's own connection while it leads.
SELECT pg_try_advisory_lock($1);

-- name: churned_tables
-- fluxpg's tables with their dead and live row counts (PostgreSQL's statistics), for the broker's
-- own vacuum (fluxpg/queues/vacuum.py). Plain tables and the transient log partition, which take
-- a row version per message or per claim (outbox, outbox_commits, pending, cursors, heads,
-- members, log_transient, ...); not the durable log's segments, which are only ever appended to
-- and dropped whole by retention (thousands of them: reading their statistics every few seconds
-- would be most of this query's cost). Only tables this role may vacuum (their owner's members;
-- a superuser is a member of every role): a broker running as a role that does not own the schema
-- leaves them to autovacuum instead of a skipped VACUUM and its warning every heartbeat.
SELECT format('%I.%I', n.nspname, c.relname), pg_stat_get_dead_tuples(c.oid), pg_stat_get_live_tuples(c.oid)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'fluxpg' AND c.relkind = 'r' AND (NOT c.relispartition OR c.relname = 'log_transient')
   AND pg_has_role(current_user, c.relowner, 'MEMBER');

-- name: vacuum_table
-- {table}: a name churned_tables returned (quoted by format('%I.%I')). SKIP_LOCKED: another
-- node (or autovacuum) vacuuming it already is enough.
VACUUM (SKIP_LOCKED) {table};

-- name: dead_rows
SELECT pg_stat_get_dead_tuples($1::regclass);
