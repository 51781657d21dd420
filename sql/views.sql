-- Views for people and scripts (DESIGN §3). Columns listed in DESIGN are a public contract.

-- Every segment (child table of a queue's log table) with its offset range, read from the
-- partition bounds in the catalog: FOR VALUES FROM (p, 'a') TO (p, 'b').
CREATE OR REPLACE VIEW fluxpg._segment_list AS
SELECT q.id AS queue_id, q.name AS queue, b.m[1]::int AS partition, c.oid::regclass AS segment,
       c.relname::text AS name, b.m[2]::bigint AS from_seq, b.m[4]::bigint AS to_seq
  FROM fluxpg.queues q
  JOIN pg_class parent ON parent.relname = 'log_' || q.id AND parent.relnamespace = 'fluxpg'::regnamespace
  JOIN pg_inherits i ON i.inhparent = parent.oid AND NOT i.inhdetachpending
  JOIN pg_class c ON c.oid = i.inhrelid
  CROSS JOIN LATERAL (SELECT regexp_match(pg_get_expr(c.relpartbound, c.oid),
                      'FROM \((\d+), ''?(\d+)''?\) TO \((\d+), ''?(\d+)''?\)') AS m) b;

-- Per-segment statistics for people; counts rows, so it reads every segment.
CREATE OR REPLACE FUNCTION fluxpg._segment_stats(seg regclass, OUT rows bigint, OUT min_created_at timestamptz,
                                                 OUT max_created_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
BEGIN
  EXECUTE format('SELECT count(*), min(created_at), max(created_at) FROM %s', seg) INTO rows, min_created_at, max_created_at;
END $$;

CREATE OR REPLACE VIEW fluxpg.segments AS
SELECT sl.queue, sl.partition, sl.name, sl.from_seq, sl.to_seq, st.rows,
       pg_total_relation_size(sl.segment) AS bytes, st.min_created_at, st.max_created_at
  FROM fluxpg._segment_list sl CROSS JOIN LATERAL fluxpg._segment_stats(sl.segment) st
 ORDER BY sl.queue, sl.partition, sl.from_seq;
COMMENT ON VIEW fluxpg.segments IS 'Log segments per queue partition: offset range [from_seq, to_seq), rows, size, time range';

-- Committed offset of each group partition: classic = lowest pending offset, else the cursor;
-- stream = the checkpoint.
CREATE OR REPLACE VIEW fluxpg._group_progress AS
SELECT g.id AS group_id, g.queue_id, g.name, g.mode, c.partition, c.cursor,
       CASE WHEN g.mode = 'classic'
            THEN coalesce((SELECT min(p.seq) FROM fluxpg.pending p WHERE p.group_id = g.id AND p.partition = c.partition), c.cursor)
            ELSE c.committed END AS committed
  FROM fluxpg.groups g JOIN fluxpg.cursors c ON c.group_id = g.id;

-- The oldest retained message of a queue. Planned for the one queue (a custom plan: the log's
-- queue partition is chosen at plan time). Inline in queue_stats, the per-queue lateral scan was
-- planned over every queue's segments and rescanned them all for each queue: 27 s for 400 queues
-- and 1,600 segments, which timed out /metrics and the tests that read queue_stats.
CREATE OR REPLACE FUNCTION fluxpg._oldest_at(qid int) RETURNS timestamptz
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan AS $$
DECLARE
  oldest timestamptz;
BEGIN
  SELECT min(o.created_at) INTO oldest
    FROM fluxpg.heads h
   CROSS JOIN LATERAL (SELECT l.created_at FROM fluxpg.log l
                        WHERE l.queue_id = qid AND l.partition = h.partition AND l.seq >= h.first_seq
                        ORDER BY l.seq LIMIT 1) o
   WHERE h.queue_id = qid;
  RETURN oldest;
END $$;

-- kind: classic, stream or transient (a classic queue whose messages live in the unlogged
-- fluxpg.log_transient and that goes with its node); bytes of a transient queue: the payload
-- bytes it holds (heads.bytes; it has no segments).
CREATE OR REPLACE VIEW fluxpg.queue_stats AS
SELECT q.name AS queue, CASE WHEN q.durability = 'transient' THEN 'transient' ELSE q.kind END AS kind, q.partitions,
       sum(h.next_seq)::bigint AS head,
       sum(CASE WHEN q.kind = 'classic'
                THEN h.next_seq - fl.floor - fluxpg._redriven_since(q.id, h.partition, fl.floor)
                ELSE h.next_seq - h.first_seq END)::bigint AS depth,
       CASE WHEN q.durability = 'transient' THEN sum(h.bytes)
            ELSE (SELECT coalesce(sum(pg_total_relation_size(sl.segment)), 0) FROM fluxpg._segment_list sl WHERE sl.queue_id = q.id)
       END::bigint AS bytes,
       (SELECT count(*) FROM fluxpg._segment_list sl WHERE sl.queue_id = q.id)::int AS segments,
       fluxpg._oldest_at(q.id) AS oldest_at,
       q.topics, (SELECT count(*) FROM fluxpg.groups g WHERE g.queue_id = q.id)::int AS groups,
       (SELECT st.outbox FROM fluxpg._staging(q.id) st) AS outbox,
       (SELECT st.staging_transactions FROM fluxpg._staging(q.id) st) AS staging_transactions,
       (SELECT st.oldest_staging_age FROM fluxpg._staging(q.id) st) AS oldest_staging_age,
       -- consumers: members seen in the last minute (a waiting consumer polls every second;
       -- a member row outlives its consumer until its node goes, to release its entries then).
       (SELECT count(*) FROM fluxpg.members m JOIN fluxpg.groups g ON g.id = m.group_id
         WHERE g.queue_id = q.id AND m.last_seen_at > now() - interval '1 minute')::int AS consumers
  FROM fluxpg.queues q JOIN fluxpg.heads h ON h.queue_id = q.id
  -- A classic queue's messages below the slowest group's committed offset are gone for every group.
 CROSS JOIN LATERAL (SELECT greatest(h.first_seq, coalesce((SELECT min(gp.committed) FROM fluxpg._group_progress gp
                                                            WHERE gp.queue_id = q.id AND gp.partition = h.partition),
                                                           h.first_seq)) AS floor) fl
 GROUP BY q.id
 ORDER BY q.name;
COMMENT ON VIEW fluxpg.queue_stats IS 'Per queue: kind (classic, stream, transient), head (messages ever appended), depth (classic and transient: waiting for the slowest group, dead letters redriven out of a DLQ not counted; stream: retained), bytes, segments, oldest retained message time, groups; outbox: messages of committed fluxpg.publish transactions waiting for the sequencer; staging_transactions / oldest_staging_age: open transactions that published to it and have not committed yet; consumers: seen in the last minute';

CREATE OR REPLACE VIEW fluxpg.group_status AS
SELECT q.name AS queue, gp.name AS grp, gp.mode, gp.partition, gp.cursor, gp.committed,
       h.next_seq - gp.committed AS lag,
       (SELECT count(*) FROM fluxpg.pending p WHERE p.group_id = gp.group_id AND p.partition = gp.partition)::int AS pending,
       now() - (SELECT min(p.delivered_at) FROM fluxpg.pending p WHERE p.group_id = gp.group_id AND p.partition = gp.partition) AS oldest_pending_age,
       g.filter, g.auto_commit,
       -- Live consumers only: seen within the queue's delivery.member_timeout (members rows outlive
       -- their consumers until expire_groups removes them).
       (SELECT count(*) FROM fluxpg.members m WHERE m.group_id = g.id
           AND m.last_seen_at > now() - fluxpg._interval(q.settings #>> '{delivery,member_timeout}'))::int AS consumers,
       g.last_active_at
  FROM fluxpg._group_progress gp
  JOIN fluxpg.groups g ON g.id = gp.group_id
  JOIN fluxpg.queues q ON q.id = gp.queue_id
  JOIN fluxpg.heads h ON h.queue_id = gp.queue_id AND h.partition = gp.partition
 ORDER BY q.name, gp.name, gp.partition;
COMMENT ON VIEW fluxpg.group_status IS 'Per group and partition: cursor (next to deliver), committed (safe floor), lag, pending entries and the age of the oldest';

CREATE OR REPLACE VIEW fluxpg.pending_entries AS
SELECT q.name AS queue, g.name AS grp, p.partition, p.seq, p.consumer, now() - p.delivered_at AS idle,
       p.delivery_count, p.delivered_at, p.visible_at, q.name || ':' || p.seq AS message_id,
       p.last_error
  FROM fluxpg.pending p
  JOIN fluxpg.groups g ON g.id = p.group_id
  JOIN fluxpg.queues q ON q.id = g.queue_id
 ORDER BY q.name, g.name, p.partition, p.seq;
COMMENT ON VIEW fluxpg.pending_entries IS 'XPENDING: every delivered, unacknowledged message with its consumer, idle time and delivery count; last_error says why a due entry could not be dead-lettered (it is parked and retried)';
