-- fluxpg SQL API (DESIGN §3). Public: declare_queue, publish, claim, read, ack, nack, reject,
-- commit, seek, claim_stale, enforce_retention. Names starting with _ are internal.
-- Errors: SQLSTATE class FP (FP001 unknown queue, FP002 wrong kind, FP003 queue full,
-- FP004 invalid argument, FP005 unknown group, FP008 precondition failed) or standard ones (54000 payload too large).
-- Every function is CREATE OR REPLACE: a migration re-runs this file to upgrade them.

-- ---------------------------------------------------------------------------------------------
-- Helpers: settings, durations, topics
-- ---------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION fluxpg.default_settings(kind text DEFAULT 'classic') RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
  SELECT jsonb_build_object(
    'limits', jsonb_build_object('max_message_size', 10485760,
                                 'max_depth', CASE WHEN kind = 'stream' THEN 0 ELSE 100000 END, 'message_ttl', '168h',
                                 'overflow', 'reject-publish'),
    'retry', jsonb_build_object('max_retries', 10, 'initial_backoff', '5s', 'max_backoff', '5m', 'multiplier', 2.0,
                                'nack_backoff', false),
    'dlq', jsonb_build_object('enabled', true, 'topic', '', 'expired', false),
    'retention', jsonb_build_object('max_age', CASE WHEN kind = 'stream' THEN '168h' ELSE '0s' END,
                                    'max_length_bytes', 0, 'max_length_messages', 0),
    'delivery', jsonb_build_object('visibility_timeout', '30s', 'max_pending', 100000,
                                   'auto_commit_interval', '5s', 'member_timeout', '30s', 'max_groups', 50),
    'primary_group', '',
    'reserved', false,
    'partitions', 1,
    'segment_size', 100000)
$$;
COMMENT ON FUNCTION fluxpg.default_settings(text) IS 'The settings a queue gets for every key its declaration leaves out (FluxMQ defaults)';

-- Deep merge of two JSON objects: keys of b win, nested objects are merged.
CREATE OR REPLACE FUNCTION fluxpg._merge(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
  SELECT coalesce(jsonb_object_agg(k,
           CASE WHEN jsonb_typeof(a -> k) = 'object' AND jsonb_typeof(b -> k) = 'object'
                THEN fluxpg._merge(a -> k, b -> k)
                ELSE coalesce(b -> k, a -> k) END), '{}'::jsonb)
  FROM (SELECT jsonb_object_keys(a) UNION SELECT jsonb_object_keys(b)) AS keys(k)
$$;

-- Go-style durations as in the YAML ("5s", "1m30s", "168h", "500ms"; "0" disables).
CREATE OR REPLACE FUNCTION fluxpg._interval(d text, what text DEFAULT 'duration') RETURNS interval
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF d IS NULL OR d = '' OR d = '0' THEN RETURN interval '0'; END IF;
  IF d !~ '^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('%s: invalid duration %L, expected e.g. "500ms", "5s", "1m30s", "168h" or "0"', what, d);
  END IF;
  RETURN replace(replace(replace(d, 'µs', 'us'), 'ns', '000us')::text, 'us', 'microseconds ')::interval;
END $$;

-- The routing key of a queue topic: everything after $queue/<name>/ ('' for the queue root).
CREATE OR REPLACE FUNCTION fluxpg.routing_key(topic text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT coalesce(substring(topic FROM '^\$queue/[^/]+/(.*)$'), '')
$$;

-- An MQTT topic filter compiled to an anchored regular expression: '+' one level, a trailing '#'
-- any number of levels including none ('a/#' matches 'a'), literal levels escaped.
CREATE OR REPLACE FUNCTION fluxpg.filter_regex(filter text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
  levels text[] := string_to_array(filter, '/');
  n int := array_length(levels, 1);
  rx text := '';
BEGIN
  IF filter IS NULL THEN RETURN NULL; END IF;
  IF filter = '' THEN RETURN '^$'; END IF;
  FOR i IN 1 .. n LOOP
    IF levels[i] = '#' THEN
      IF i <> n THEN
        RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = format('invalid topic filter %L: # must be the last level', filter);
      END IF;
      rx := rx || CASE WHEN i = 1 THEN '.*' ELSE '(/.*)?' END;
      RETURN '^' || rx || '$';
    END IF;
    IF i > 1 THEN rx := rx || '/'; END IF;
    IF levels[i] = '+' THEN
      rx := rx || '[^/]*';
    ELSIF levels[i] ~ '[+#]' THEN
      RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = format('invalid topic filter %L: + and # must fill a whole level', filter);
    ELSE
      rx := rx || regexp_replace(levels[i], '([.^$*+?()\[\]{}|\\-])', '\\\1', 'g');
    END IF;
  END LOOP;
  RETURN '^' || rx || '$';
END $$;

-- MQTT matching of a topic name against a filter, including the rule that filters starting with a
-- wildcard do not match topics starting with '$'.
-- The two shapes nearly every binding has, a literal filter and `prefix/#` without '+', are
-- decided with string comparisons; only the rest builds a regex (fluxpg.filter_regex is plpgsql:
-- routing every publish through it cost ~100 µs per queue binding). Inlined by the planner.
CREATE OR REPLACE FUNCTION fluxpg.topic_matches(filter text, topic text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE
    WHEN strpos(filter, '+') = 0 AND strpos(filter, '#') = 0 THEN filter = topic
    WHEN strpos(filter, '+') = 0 AND strpos(filter, '#') = length(filter) AND right(filter, 2) = '/#'
      THEN starts_with(topic || '/', left(filter, -1))
    ELSE NOT (left(topic, 1) = '$' AND left(filter, 1) IN ('+', '#')) AND topic ~ fluxpg.filter_regex(filter)
  END
$$;

-- The lowest and highest of a set of offsets. Every `seq = ANY (seqs)` against pending (and the
-- log) also says `seq BETWEEN fluxpg._lo(seqs) AND fluxpg._hi(seqs)`: with stale statistics the
-- planner otherwise may read every pending row of the group and filter (measured: 64 ms instead of
-- 3 ms for acking 500 of 10,000 pending); the range keeps it an index range scan.
-- plpgsql, not sql: an SQL function with an aggregate is not inlined, and its body was parsed
-- and planned on every call (52 and 23 µs of each fluxpg.ack call, pg_stat_user_functions); a
-- plpgsql body keeps its plan for the session.
CREATE OR REPLACE FUNCTION fluxpg._lo(seqs bigint[]) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$ BEGIN RETURN (SELECT min(s) FROM unnest(seqs) s); END $$;
CREATE OR REPLACE FUNCTION fluxpg._hi(seqs bigint[]) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$ BEGIN RETURN (SELECT max(s) FROM unnest(seqs) s); END $$;

CREATE OR REPLACE FUNCTION fluxpg._raise(code text, msg text) RETURNS void
LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION USING ERRCODE = code, MESSAGE = msg; END $$;

-- Queue and consumer-group name rules: defined here only. Python's validate_queue_name and
-- validate_group_name (fluxpg/topics.py) mirror them for offline checks (config files, wire
-- input before a round trip); tests/integration/test_one_truth.py feeds both the same names.
-- NULL = valid, else the reason.
CREATE OR REPLACE FUNCTION fluxpg.queue_name_error(name text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
  base text := name;
BEGIN
  IF base LIKE '$dlq/%' THEN base := substr(base, 6); END IF;  -- a dead-letter queue $dlq/<name>
  IF base IS NULL OR base = '' THEN RETURN 'must not be empty'; END IF;
  IF length(base) > 200 THEN RETURN format('is %s characters, at most 200', length(base)); END IF;
  IF base ~ '[/+#]' THEN RETURN 'must not contain /, + or #'; END IF;
  IF base ~ '[\x01-\x1f\x7f]' THEN RETURN 'must not contain control characters'; END IF;
  IF left(base, 1) = ' ' OR right(base, 1) = ' ' THEN RETURN 'must not start or end with a space'; END IF;
  IF left(base, 1) = '$' THEN RETURN 'must not start with $ (reserved, e.g. for $dlq/<queue>)'; END IF;
  RETURN NULL;
END $$;
COMMENT ON FUNCTION fluxpg.queue_name_error(text) IS 'Why a queue name is invalid, NULL when it is valid: 1-200 characters without /, +, #, control characters, leading or trailing spaces or a leading $ (after an optional $dlq/ prefix)';

-- A group's internal name is `group` or `group@filter` (DESIGN §2).
CREATE OR REPLACE FUNCTION fluxpg.group_name_error(grp text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
  part text := split_part(grp, '@', 1);
BEGIN
  IF grp IS NULL OR part = '' THEN RETURN 'must not be empty'; END IF;
  IF length(grp) > 400 THEN RETURN format('is %s characters, at most 400', length(grp)); END IF;
  IF grp ~ '[\x01-\x1f\x7f]' THEN RETURN 'must not contain control characters'; END IF;
  IF left(part, 1) = ' ' OR right(part, 1) = ' ' THEN RETURN 'must not start or end with a space'; END IF;
  RETURN NULL;
END $$;
COMMENT ON FUNCTION fluxpg.group_name_error(text) IS 'Why a consumer group''s internal name (group or group@filter) is invalid, NULL when it is valid: at most 400 characters, a non-empty group part without leading or trailing spaces, no control characters';

CREATE OR REPLACE FUNCTION fluxpg._queue(qname text, want text DEFAULT NULL, what text DEFAULT NULL)
RETURNS fluxpg.queues LANGUAGE plpgsql STABLE AS $$
DECLARE q fluxpg.queues;
BEGIN
  SELECT * INTO q FROM fluxpg.queues WHERE name = qname;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'FP001', MESSAGE = format('unknown queue %L', qname),
      HINT = 'declare it in the config (queues:) or with fluxpg.declare_queue()';
  END IF;
  IF want IS NOT NULL AND q.kind <> want THEN
    RAISE EXCEPTION USING ERRCODE = 'FP002',
      MESSAGE = format('queue %L is a %s queue; %s works on %s queues', qname, q.kind, coalesce(what, 'this'), want);
  END IF;
  RETURN q;
END $$;

-- The group of a queue by internal name (group or group@filter), created on first use at the
-- oldest retained message when create is true.
CREATE OR REPLACE FUNCTION fluxpg._group(q fluxpg.queues, grp text, create_missing boolean DEFAULT true)
RETURNS fluxpg.groups LANGUAGE plpgsql AS $$
DECLARE
  g fluxpg.groups;
  at int;
  flt text;
BEGIN
  SELECT * INTO g FROM fluxpg.groups WHERE queue_id = q.id AND name = grp;
  IF FOUND THEN RETURN g; END IF;
  IF fluxpg.group_name_error(grp) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004',
      MESSAGE = format('invalid consumer group %L: %s', grp, fluxpg.group_name_error(grp));
  END IF;
  IF NOT create_missing THEN
    -- Settling (ack/nack/reject/commit) may name the group by its plain part, `mg` for `mg@#`,
    -- when only one group of the queue has it; fluxpg.resolve_group says why not otherwise.
    flt := fluxpg.resolve_group(q.name, grp);  -- the internal name (flt reused as a scratch variable)
    SELECT * INTO g FROM fluxpg.groups g2 WHERE g2.queue_id = q.id AND g2.name = flt;
    RETURN g;
  END IF;
  IF q.kind = 'stream' AND (SELECT count(*) FROM fluxpg.groups WHERE queue_id = q.id)
       >= coalesce((q.settings #>> '{delivery,max_groups}')::int, 50) THEN
    RAISE EXCEPTION USING ERRCODE = 'FP006',
      MESSAGE = format('stream %L has %s consumer groups already (delivery.max_groups); group %L is refused',
                       q.name, q.settings #>> '{delivery,max_groups}', grp);
  END IF;
  at := position('@' IN grp);
  flt := CASE WHEN at > 0 THEN substr(grp, at + 1) END;
  INSERT INTO fluxpg.groups (queue_id, name, mode, filter, filter_regex)
  VALUES (q.id, grp, q.kind, flt, CASE WHEN flt IS NOT NULL AND flt <> '#' THEN fluxpg.filter_regex(flt) END)
  ON CONFLICT (queue_id, name) DO NOTHING
  RETURNING * INTO g;
  IF NOT FOUND THEN  -- created concurrently by another consumer
    SELECT * INTO g FROM fluxpg.groups WHERE queue_id = q.id AND name = grp;
    RETURN g;
  END IF;
  INSERT INTO fluxpg.cursors (group_id, partition, cursor, committed)
  SELECT g.id, h.partition, h.first_seq, h.first_seq FROM fluxpg.heads h WHERE h.queue_id = q.id;
  RETURN g;
END $$;

-- A group as people name it: the internal name (`workers@#`, what a subscription to
-- $queue/orders/# creates) or just the group part (`workers`) when exactly one group of the queue
-- has it. Used by the CLI (fluxpg pending) and MQTT acks with a plain group-id.
CREATE OR REPLACE FUNCTION fluxpg.resolve_group(queue text, grp text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue);
  names text[];
BEGIN
  IF EXISTS (SELECT 1 FROM fluxpg.groups g WHERE g.queue_id = q.id AND g.name = grp) THEN RETURN grp; END IF;
  SELECT array_agg(g.name ORDER BY g.name) INTO names
    FROM fluxpg.groups g WHERE g.queue_id = q.id AND split_part(g.name, '@', 1) = grp;
  IF cardinality(names) = 1 THEN RETURN names[1]; END IF;
  IF cardinality(names) > 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'FP005',
      MESSAGE = format('queue %L has several groups named %L: %s; give the full name', q.name, grp,
                       array_to_string(names, ', '));
  END IF;
  SELECT array_agg(g.name ORDER BY g.name) INTO names FROM fluxpg.groups g WHERE g.queue_id = q.id;
  RAISE EXCEPTION USING ERRCODE = 'FP005',
    MESSAGE = format('queue %L has no consumer group %L (%s)', q.name, grp,
                     coalesce('its groups: ' || array_to_string(names, ', '), 'it has no groups yet'));
END $$;
COMMENT ON FUNCTION fluxpg.resolve_group(text, text) IS 'The internal name of a group given as group or group@filter: exact match first, else the only group whose part before @ matches; FP005 naming the groups otherwise';

-- Lock order of a queue's consumer state, the one every path follows: queue row, heads, group
-- row, cursor rows, member rows — the order in which `DELETE FROM fluxpg.queues` (an operator's,
-- or fluxpg.delete_queue) and `DELETE FROM fluxpg.groups` cascade, which nothing can change. So a
-- consumer never waits for a group row while holding anything of it (the last_active_at stamp is
-- skipped when the row is locked), and a claim or read locks its member row last, after the
-- cursor row: _ensure_member at the start only creates a missing member row (an existing one is
-- not locked), _touch_member at the end stamps it. Pending rows are taken SKIP LOCKED.

-- A consumer's member row exists (created on first use, before the cursor row is locked: the
-- insert's foreign key check waits on the group row, which a cascade locks before the cursors).
-- An existing row is neither locked nor written here.
CREATE OR REPLACE FUNCTION fluxpg._ensure_member(gid int, consumer text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  IF consumer IS NULL OR consumer = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = 'consumer name must not be empty';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM fluxpg.members m WHERE m.group_id = gid AND m.name = consumer) THEN
    INSERT INTO fluxpg.members (group_id, name, node_id, last_seen_at)
    VALUES (gid, consumer, nullif(current_setting('fluxpg.node_id', true), '')::int, now())
    ON CONFLICT (group_id, name) DO NOTHING;
  END IF;
END $$;

-- Remember that a consumer is alive (throttled to one write a second per consumer). When it
-- writes it locks the member row: call it after the cursor row, never before (see the lock order
-- above). Within the second it only reads: ON CONFLICT DO UPDATE locks the row even when its WHERE
-- skips the write, and that lock is a tuple write and a WAL record on every claim (~10 µs of each
-- handoff). Nothing needs the lock then: a member seen within the second is not one that the
-- member timeout (seconds) or a node's expiry removes.
CREATE OR REPLACE FUNCTION fluxpg._touch_member(gid int, consumer text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  node int := nullif(current_setting('fluxpg.node_id', true), '')::int;
BEGIN
  IF consumer IS NULL OR consumer = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = 'consumer name must not be empty';
  END IF;
  IF EXISTS (SELECT 1 FROM fluxpg.members m
              WHERE m.group_id = gid AND m.name = consumer AND m.last_seen_at >= now() - interval '1 second'
                AND m.node_id IS NOT DISTINCT FROM node) THEN
    RETURN;
  END IF;
  INSERT INTO fluxpg.members AS m (group_id, name, node_id, last_seen_at)
  VALUES (gid, consumer, node, now())
  ON CONFLICT (group_id, name) DO UPDATE
     SET last_seen_at = now(), node_id = EXCLUDED.node_id
   WHERE m.last_seen_at < now() - interval '1 second' OR m.node_id IS DISTINCT FROM EXCLUDED.node_id;
  IF FOUND THEN
    PERFORM fluxpg._stamp_group(gid);
  END IF;
END $$;

-- groups.last_active_at, at most every 10 seconds, and never by waiting: a group row locked by
-- someone else (a cascade deleting it, another consumer stamping it) is left as it is.
CREATE OR REPLACE FUNCTION fluxpg._stamp_group(gid int) RETURNS void
LANGUAGE sql AS $$
  UPDATE fluxpg.groups SET last_active_at = now()
   WHERE id IN (SELECT g.id FROM fluxpg.groups g
                 WHERE g.id = gid AND g.last_active_at < now() - interval '10 seconds'
                   FOR NO KEY UPDATE SKIP LOCKED)
$$;

-- ---------------------------------------------------------------------------------------------
-- Queues and segments
-- ---------------------------------------------------------------------------------------------

-- A new queue's log table joins fluxpg.log under ACCESS EXCLUSIVE on fluxpg.log alone (ONLY: not
-- its thousands of segments). ATTACH PARTITION by itself takes SHARE UPDATE EXCLUSIVE, which does
-- not conflict with the ACCESS SHARE a backend holds while it builds fluxpg.log's list of
-- partitions: a backend building that list while the ATTACH commits can keep a list without the
-- new queue until fluxpg.log changes again. Seen on PostgreSQL 16.2 (the embedded server): one
-- pool connection of a broker kept reading a new dead-letter queue as empty, and _dead_letter
-- run there would have found no rows to move. Under ACCESS EXCLUSIVE every reader builds the
-- list after the commit. Each attempt waits at most 50 ms (readers and writers of every queue
-- queue behind a waiting ACCESS EXCLUSIVE); between attempts, sleeps growing by 5 ms let them
-- through. 40 attempts: about 6 s in all (2 s of waiting, 4.1 s of sleeps); then the declaration
-- fails with lock_not_available and can be retried (a long transaction reading fluxpg.log holds
-- it off).
CREATE OR REPLACE FUNCTION fluxpg._lock_log_for_new_queue(qname text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  timeout text := current_setting('lock_timeout');
BEGIN
  FOR attempt IN 1 .. 40 LOOP
    BEGIN
      PERFORM set_config('lock_timeout', '50ms', true);   -- undone with the subtransaction on failure
      LOCK TABLE ONLY fluxpg.log IN ACCESS EXCLUSIVE MODE;
      PERFORM set_config('lock_timeout', timeout, true);
      RETURN;
    EXCEPTION WHEN lock_not_available THEN
      PERFORM pg_sleep(0.005 * attempt);
    END;
  END LOOP;
  RAISE EXCEPTION USING ERRCODE = 'lock_not_available',
    MESSAGE = format('cannot create queue %L now: fluxpg.log is busy (a long transaction reads it); try again', qname);
END $$;

-- Create segments (child tables of the queue's log table) until offset `upto` is covered.
-- Runs under the head row lock of (queue, partition), so concurrent appenders never race.
-- CREATE ... LIKE + ATTACH takes only SHARE UPDATE EXCLUSIVE on the parent: readers and
-- writers of the queue go on while a segment is added.
CREATE OR REPLACE FUNCTION fluxpg._ensure_segments(qid int, part int, upto bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  seg_end bigint;
  size bigint;
  seg text;
BEGIN
  SELECT h.segment_end, q.segment_size INTO seg_end, size
    FROM fluxpg.heads h JOIN fluxpg.queues q ON q.id = h.queue_id
   WHERE h.queue_id = qid AND h.partition = part;
  IF seg_end > upto THEN RETURN; END IF;
  WHILE seg_end <= upto LOOP
    seg := format('log_%s_p%s_%s', qid, part, seg_end);
    EXECUTE format('CREATE TABLE fluxpg.%I (LIKE fluxpg.%I INCLUDING ALL)', seg, 'log_' || qid);
    EXECUTE format('ALTER TABLE fluxpg.%I ATTACH PARTITION fluxpg.%I FOR VALUES FROM (%s, %s) TO (%s, %s)',
                   'log_' || qid, seg, part, seg_end, part, seg_end + size);
    seg_end := seg_end + size;
  END LOOP;
  UPDATE fluxpg.heads SET segment_end = seg_end WHERE queue_id = qid AND partition = part;
END $$;

-- A queue's name checked and its settings completed with the defaults and validated: what the
-- hot path will cast fails here, at declaration, and not at the first publish. Shared by
-- declare_queue and declare_transient, so both kinds of queue obey the same rules.
CREATE OR REPLACE FUNCTION fluxpg._settings(qname text, qkind text, settings jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
  s jsonb;
BEGIN
  IF fluxpg.queue_name_error(qname) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004',
      MESSAGE = format('invalid queue name %L: %s', qname, fluxpg.queue_name_error(qname));
  END IF;
  IF qkind IS NULL OR qkind NOT IN ('classic', 'stream') THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = format('invalid queue kind %L: expected classic or stream', qkind);
  END IF;
  IF settings IS NOT NULL AND jsonb_typeof(settings) <> 'object' THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = 'settings must be a JSON object';
  END IF;
  s := fluxpg._merge(fluxpg.default_settings(qkind), coalesce(settings, '{}'));
  IF s #>> '{limits,overflow}' NOT IN ('reject-publish', 'drop-head') THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004',
      MESSAGE = format('limits.overflow must be reject-publish or drop-head, got %L', s #>> '{limits,overflow}');
  END IF;
  PERFORM fluxpg._interval(s #>> '{limits,message_ttl}', 'limits.message_ttl'),
          fluxpg._interval(s #>> '{retry,initial_backoff}', 'retry.initial_backoff'),
          fluxpg._interval(s #>> '{retry,max_backoff}', 'retry.max_backoff'),
          fluxpg._interval(s #>> '{retention,max_age}', 'retention.max_age'),
          fluxpg._interval(s #>> '{delivery,visibility_timeout}', 'delivery.visibility_timeout'),
          fluxpg._interval(s #>> '{delivery,auto_commit_interval}', 'delivery.auto_commit_interval'),
          (s #>> '{limits,max_message_size}')::bigint, (s #>> '{limits,max_depth}')::bigint,
          (s #>> '{retry,max_retries}')::int, (s #>> '{retry,multiplier}')::float8,
          (s #>> '{dlq,enabled}')::boolean, (s #>> '{delivery,max_pending}')::int,
          (s #>> '{retention,max_length_bytes}')::bigint, (s #>> '{retention,max_length_messages}')::bigint,
          (s #>> '{retry,nack_backoff}')::boolean, (s #>> '{dlq,expired}')::boolean;
  -- The same checks as fluxpg.config (RetryConfig, LimitsConfig, DlqConfig): one rule, two callers.
  IF (s #>> '{retry,multiplier}')::float8 < 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004',
      MESSAGE = format('retry.multiplier must be at least 1, got %s', s #>> '{retry,multiplier}');
  END IF;
  IF fluxpg._interval(s #>> '{retry,initial_backoff}') > fluxpg._interval(s #>> '{retry,max_backoff}') THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004',
      MESSAGE = format('retry.initial_backoff (%s) must not exceed retry.max_backoff (%s)',
                       s #>> '{retry,initial_backoff}', s #>> '{retry,max_backoff}');
  END IF;
  IF (s #>> '{retry,max_retries}')::int < 0 OR (s #>> '{limits,max_message_size}')::bigint < 0
     OR (s #>> '{limits,max_depth}')::bigint < 0 OR (s #>> '{retention,max_length_bytes}')::bigint < 0
     OR (s #>> '{retention,max_length_messages}')::bigint < 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004',
      MESSAGE = 'retry.max_retries, limits.max_message_size, limits.max_depth and retention.max_length_* must not be negative';
  END IF;
  IF coalesce(s #>> '{dlq,topic}', '') <> '' THEN
    -- dlq.topic names the dead-letter queue (created on first use like $dlq/<name>).
    IF fluxpg.queue_name_error(s #>> '{dlq,topic}') IS NOT NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = format('dlq.topic %L is not a queue name: %s',
        s #>> '{dlq,topic}', fluxpg.queue_name_error(s #>> '{dlq,topic}'));
    END IF;
    IF s #>> '{dlq,topic}' = qname THEN
      RAISE EXCEPTION USING ERRCODE = 'FP004',
        MESSAGE = format('dlq.topic of queue %L names the queue itself', qname);
    END IF;
  END IF;
  RETURN s;
END $$;

-- if_absent: create only. Auto-creation (a publish or a consumer naming a queue nobody declared:
-- the broker's queue_manager.auto_create, a first dead letter) passes it: the caller looked the
-- name up before, and an upsert would reset a queue declared since then (by another node, the
-- CLI, SQL, AMQP queue.declare) with custom settings to the defaults. Explicit declarations
-- upsert.
CREATE OR REPLACE FUNCTION fluxpg.declare_queue(name text, kind text, topics text[] DEFAULT NULL,
                                                settings jsonb DEFAULT '{}', if_absent boolean DEFAULT false)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
  qname text := name;
  qkind text := kind;
  s jsonb := fluxpg._settings(name, kind, settings);
  q fluxpg.queues;
  parts int;
  size bigint;
  old_parts int;
  t text;
BEGIN
  parts := (s ->> 'partitions')::int;
  size := (s ->> 'segment_size')::bigint;
  IF parts IS NULL OR parts < 1 OR parts > 1024 THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = format('partitions must be between 1 and 1024, got %s', s ->> 'partitions');
  END IF;
  IF parts > 1 AND qkind = 'classic' THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = 'partitions > 1 needs a stream queue (classic queues have one partition)';
  END IF;
  IF size IS NULL OR size < 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = format('segment_size must be positive, got %s', s ->> 'segment_size');
  END IF;
  topics := coalesce(topics, ARRAY['$queue/' || qname || '/#']);
  IF cardinality(topics) = 0 THEN topics := ARRAY['$queue/' || qname || '/#']; END IF;
  FOREACH t IN ARRAY topics LOOP
    PERFORM fluxpg.filter_regex(t);  -- raises on an invalid filter
  END LOOP;

  -- Two nodes declaring the same new queue at start-up: the second waits for the first, and its
  -- look-up below finds the queue the first created (READ COMMITTED: a snapshot per statement).
  PERFORM pg_advisory_xact_lock(hashtext('fluxpg.declare_queue'), hashtext(qname));
  SELECT * INTO q FROM fluxpg.queues WHERE queues.name = qname FOR UPDATE;
  IF FOUND AND if_absent THEN
    RETURN q.id;   -- whatever exists is the queue, as it is (any kind, durable or transient)
  END IF;
  IF FOUND AND q.durability = 'transient' THEN
    RAISE EXCEPTION USING ERRCODE = 'FP002',
      MESSAGE = format('queue %L exists as a transient queue; it cannot be redeclared durable', qname);
  END IF;
  IF FOUND THEN
    IF q.kind <> qkind THEN
      RAISE EXCEPTION USING ERRCODE = 'FP002',
        MESSAGE = format('queue %L already exists as a %s queue; it cannot be redeclared as %s', qname, q.kind, qkind);
    END IF;
    IF parts < q.partitions THEN
      RAISE EXCEPTION USING ERRCODE = 'FP004',
        MESSAGE = format('queue %L has %s partitions; they cannot be reduced to %s', qname, q.partitions, parts);
    END IF;
    old_parts := q.partitions;
    UPDATE fluxpg.queues SET topics = declare_queue.topics, partitions = parts, segment_size = size,
                             settings = s, updated_at = now()
     WHERE id = q.id RETURNING * INTO q;
  ELSE
    old_parts := 0;
    INSERT INTO fluxpg.queues (name, kind, topics, partitions, segment_size, settings)
    VALUES (qname, qkind, declare_queue.topics, parts, size, s) RETURNING * INTO q;
    PERFORM fluxpg._lock_log_for_new_queue(qname);
    EXECUTE format('CREATE TABLE fluxpg.%I (LIKE fluxpg.log INCLUDING ALL) PARTITION BY RANGE (partition, seq)', 'log_' || q.id);
    EXECUTE format('ALTER TABLE fluxpg.log ATTACH PARTITION fluxpg.%I FOR VALUES IN (%s)', 'log_' || q.id, q.id);
    EXECUTE format('COMMENT ON TABLE fluxpg.%I IS %L', 'log_' || q.id, format('Log of queue %s (segments are its partitions)', qname));
  END IF;
  FOR p IN old_parts .. parts - 1 LOOP
    INSERT INTO fluxpg.heads (queue_id, partition) VALUES (q.id, p);
    PERFORM fluxpg._ensure_segments(q.id, p, size / 2);
    INSERT INTO fluxpg.cursors (group_id, partition, cursor, committed)
    SELECT g.id, p, 0, 0 FROM fluxpg.groups g WHERE g.queue_id = q.id;
  END LOOP;
  PERFORM pg_notify('fluxpg_queues', q.id::text);
  RETURN q.id;
END $$;
COMMENT ON FUNCTION fluxpg.declare_queue(text, text, text[], jsonb, boolean) IS 'Create a queue with its first segment, or update its topics and settings (if_absent: leave an existing queue as it is); returns its id';

-- ---------------------------------------------------------------------------------------------
-- Transient queues (migration 0005): classic queues whose messages live in the UNLOGGED default
-- partition of the log (fluxpg.log_transient) and that go with their node. Every other function
-- treats them as classic queues; the differences are spelled out where they occur (append:
-- byte bound; ack / dead-letter: their rows are deleted at once).
-- ---------------------------------------------------------------------------------------------

-- Create a transient queue, or return the existing one. No DDL: one row in queues and one in
-- heads (segment_end at the top of bigint, so _reserve never creates segments for it). `owner`
-- makes it exclusive to one connection: a declare with another owner raises FP007.
CREATE OR REPLACE FUNCTION fluxpg.declare_transient(name text, owner_node int, owner text DEFAULT NULL,
                                                    auto_delete boolean DEFAULT false, settings jsonb DEFAULT '{}')
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
  qname text := name;
  s jsonb := fluxpg._settings(name, 'classic', settings);
  q fluxpg.queues;
BEGIN
  IF owner_node IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = 'a transient queue needs an owner node';
  END IF;
  INSERT INTO fluxpg.queues AS nq (name, kind, topics, partitions, segment_size, settings, durability,
                                   owner_node, owner, auto_delete)
  VALUES (qname, 'classic', ARRAY['$queue/' || qname || '/#'], 1, (s ->> 'segment_size')::bigint, s, 'transient',
          declare_transient.owner_node, declare_transient.owner, declare_transient.auto_delete)
  ON CONFLICT ON CONSTRAINT queues_name_key DO NOTHING
  RETURNING * INTO q;
  IF FOUND THEN
    INSERT INTO fluxpg.heads (queue_id, partition, segment_end) VALUES (q.id, 0, 9223372036854775807);
    PERFORM pg_notify('fluxpg_queues', 't+' || q.id);
    RETURN q.id;
  END IF;
  SELECT * INTO q FROM fluxpg.queues WHERE queues.name = qname;
  IF q.durability <> 'transient' THEN
    RAISE EXCEPTION USING ERRCODE = 'FP002',
      MESSAGE = format('queue %L exists as a durable queue; it cannot be redeclared transient', qname);
  END IF;
  IF q.owner IS DISTINCT FROM declare_transient.owner AND (q.owner IS NOT NULL OR declare_transient.owner IS NOT NULL) THEN
    RAISE EXCEPTION USING ERRCODE = 'FP007',
      MESSAGE = format('cannot obtain exclusive access to locked queue %L: it is %s', qname,
                       CASE WHEN q.owner IS NULL THEN 'not exclusive' ELSE 'exclusive to another connection' END);
  END IF;
  RETURN q.id;
END $$;
COMMENT ON FUNCTION fluxpg.declare_transient(text, int, text, boolean, jsonb) IS 'Create (or find) a transient queue owned by a node (and, when exclusive, a connection); no DDL; returns its id';

-- Delete a transient queue and its messages; returns how many messages it held (NULL: no such
-- transient queue). Durable queues are refused: they are dropped with their segments elsewhere.
CREATE OR REPLACE FUNCTION fluxpg.delete_transient(name text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues;
  depth bigint;
BEGIN
  SELECT * INTO q FROM fluxpg.queues WHERE queues.name = delete_transient.name;
  IF NOT FOUND THEN RETURN NULL; END IF;
  IF q.durability <> 'transient' THEN
    RAISE EXCEPTION USING ERRCODE = 'FP002', MESSAGE = format('queue %L is durable, not transient', name);
  END IF;
  depth := fluxpg._undelivered(q);   -- as delete_queue counts (not the queue_stats view: all queues)
  DELETE FROM fluxpg.queues WHERE id = q.id;   -- the trigger removes messages and pending entries
  RETURN coalesce(depth, 0);
END $$;
COMMENT ON FUNCTION fluxpg.delete_transient(text) IS 'Delete a transient queue with its messages; returns how many were waiting (undelivered)';

-- Messages of a transient queue below `floor` that no group has pending are gone for good
-- (acknowledged by every group, or dropped by overflow): delete them and give their bytes back.
-- Takes the head row lock (the byte counter), briefly.
CREATE OR REPLACE FUNCTION fluxpg._transient_trim(q fluxpg.queues, part int, floor_seq bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  freed bigint;
BEGIN
  WITH d AS (
    DELETE FROM fluxpg.log l
     WHERE l.queue_id = q.id AND l.partition = part AND l.seq < floor_seq
       AND NOT EXISTS (SELECT 1 FROM fluxpg.pending p JOIN fluxpg.groups g ON g.id = p.group_id
                        WHERE g.queue_id = q.id AND p.partition = part AND p.seq = l.seq)
    RETURNING octet_length(l.payload) AS b
  )
  SELECT sum(b) INTO freed FROM d;
  IF freed IS NOT NULL THEN
    UPDATE fluxpg.heads SET bytes = greatest(bytes - freed, 0) WHERE queue_id = q.id AND partition = part;
  END IF;
  RETURN coalesce(freed, 0);
END $$;

-- After group g settled (acked or dead-lettered) `seqs` of a transient queue: delete the messages
-- no other group still needs (one group, the usual case: all of them). Measured against a sweep
-- below the floor: deleting on ack keeps log_transient as small as the queues' backlog.
CREATE OR REPLACE FUNCTION fluxpg._transient_forget(q fluxpg.queues, g fluxpg.groups, part int, seqs bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  freed bigint;
BEGIN
  IF seqs IS NULL OR cardinality(seqs) = 0 THEN RETURN; END IF;
  WITH d AS (
    DELETE FROM fluxpg.log l
     WHERE l.queue_id = q.id AND l.partition = part
       AND l.seq BETWEEN fluxpg._lo(seqs) AND fluxpg._hi(seqs) AND l.seq = ANY (seqs)
       AND NOT EXISTS (SELECT 1 FROM fluxpg.groups g2 JOIN fluxpg.cursors c ON c.group_id = g2.id AND c.partition = part
                        WHERE g2.queue_id = q.id AND g2.id <> g.id
                          AND (c.cursor <= l.seq
                               OR EXISTS (SELECT 1 FROM fluxpg.pending p
                                           WHERE p.group_id = g2.id AND p.partition = part AND p.seq = l.seq)))
    RETURNING octet_length(l.payload) AS b
  )
  SELECT sum(b) INTO freed FROM d;
  IF freed IS NOT NULL THEN
    UPDATE fluxpg.heads SET bytes = greatest(bytes - freed, 0) WHERE queue_id = q.id AND partition = part;
  END IF;
END $$;

-- Charge `nbytes` of new messages to a transient queue (its head row is locked by _reserve) after
-- checking the broker-wide bound, the pool setting fluxpg.transient_max_bytes (0 or unset: none).
CREATE OR REPLACE FUNCTION fluxpg._transient_charge(q fluxpg.queues, part int, nbytes bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  lim bigint := coalesce(nullif(current_setting('fluxpg.transient_max_bytes', true), '')::bigint, 0);
  used bigint;
BEGIN
  IF lim > 0 THEN
    SELECT coalesce(sum(h.bytes), 0) INTO used FROM fluxpg.heads h WHERE h.bytes > 0;
    IF used + nbytes > lim THEN
      RAISE EXCEPTION USING ERRCODE = 'FP003',
        MESSAGE = format('transient queues are full: they hold %s bytes, queue_manager.transient_max_bytes is %s; '
                         'message(s) of %s bytes for %L refused', used, lim, nbytes, q.name);
    END IF;
  END IF;
  UPDATE fluxpg.heads SET bytes = bytes + nbytes WHERE queue_id = q.id AND partition = part;
END $$;

-- Transient queues: remove what every group is done with and what expired undelivered (the ack
-- path deletes most rows at once; this catches the rest, e.g. a second group acking later).
-- Run by the retention loop. Returns how many messages it deleted.
CREATE OR REPLACE FUNCTION fluxpg.sweep_transient() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues;
  floor_seq bigint;
  k bigint := 0;
  freed bigint;
  n bigint;
BEGIN
  FOR q IN SELECT * FROM fluxpg.queues WHERE durability = 'transient' LOOP
    SELECT min(coalesce((SELECT min(p.seq) FROM fluxpg.pending p WHERE p.group_id = c.group_id AND p.partition = 0),
                        c.cursor))
      INTO floor_seq
      FROM fluxpg.cursors c JOIN fluxpg.groups g ON g.id = c.group_id
     WHERE g.queue_id = q.id AND c.partition = 0;
    IF floor_seq IS NOT NULL THEN
      n := fluxpg._transient_trim(q, 0, floor_seq);
    END IF;
    WITH d AS (
      DELETE FROM fluxpg.log l
       WHERE l.queue_id = q.id AND l.expires_at <= now()
         AND NOT EXISTS (SELECT 1 FROM fluxpg.pending p JOIN fluxpg.groups g ON g.id = p.group_id
                          WHERE g.queue_id = q.id AND p.partition = l.partition AND p.seq = l.seq)
      RETURNING octet_length(l.payload) AS b
    )
    SELECT sum(b), count(*) INTO freed, n FROM d;
    IF freed IS NOT NULL THEN
      UPDATE fluxpg.heads SET bytes = greatest(bytes - freed, 0) WHERE queue_id = q.id AND partition = 0;
    END IF;
    k := k + coalesce(n, 0);
  END LOOP;
  RETURN k;
END $$;
COMMENT ON FUNCTION fluxpg.sweep_transient() IS 'Delete transient queues'' messages that every group is done with or that expired undelivered';

-- Messages the default group of a queue (named like the queue: what AMQP 0-9-1 consumers join)
-- can still get: undelivered ones from its cursor (or, with no such group yet, everything
-- retained), plus pending ones due again. Delivered, unacknowledged messages are not counted
-- (RabbitMQ's message_count). Expired rows not yet passed over are counted.
CREATE OR REPLACE FUNCTION fluxpg.ready_count(queue text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue);
  g fluxpg.groups;
  n bigint;
BEGIN
  SELECT * INTO g FROM fluxpg.groups WHERE queue_id = q.id AND name = q.name;
  IF NOT FOUND THEN
    SELECT sum(h.next_seq - h.first_seq) INTO n FROM fluxpg.heads h WHERE h.queue_id = q.id;
    RETURN coalesce(n, 0);
  END IF;
  SELECT sum(greatest(h.next_seq - greatest(c.cursor, h.first_seq), 0)) INTO n
    FROM fluxpg.cursors c JOIN fluxpg.heads h ON h.queue_id = q.id AND h.partition = c.partition
   WHERE c.group_id = g.id;
  IF q.kind = 'classic' THEN
    n := coalesce(n, 0) + (SELECT count(*) FROM fluxpg.pending p WHERE p.group_id = g.id AND p.visible_at <= now());
  END IF;
  RETURN coalesce(n, 0);
END $$;
COMMENT ON FUNCTION fluxpg.ready_count(text) IS 'Messages the queue''s default group can still get (AMQP message_count): undelivered plus due redeliveries';


-- The queues whose topic bindings match a topic, with what a publish needs of them. Reserved
-- queues (the catch-all `mqtt` queue on $queue/#) only take what no other queue does. A single
-- SELECT in an SQL function: the planner inlines it into its callers' queries (fluxpg.route, and
-- fluxpg.publish, which routes and stages in one statement).
CREATE OR REPLACE FUNCTION fluxpg._routes(topic text)
RETURNS TABLE (id int, name text, max_message_size bigint)
LANGUAGE sql STABLE AS $$
  SELECT m.id, m.name, m.lim
    FROM (SELECT q.id, q.name, coalesce((q.settings #>> '{limits,max_message_size}')::bigint, 0) AS lim,
                 coalesce((q.settings ->> 'reserved')::boolean, false) AS reserved,
                 bool_or(NOT coalesce((q.settings ->> 'reserved')::boolean, false)) OVER () AS any_plain
            FROM fluxpg.queues q
           WHERE EXISTS (SELECT 1 FROM unnest(q.topics) f WHERE fluxpg.topic_matches(f, _routes.topic))) m
   WHERE m.reserved <> m.any_plain
$$;

-- The partition of a message with partition key k (else its topic's routing key) in a queue of
-- `parts` partitions; NULL when it has neither (append_batch then goes round robin). An SQL
-- expression function: the planner inlines it into append_batch's per-row query, and plpgsql
-- evaluates it as a simple expression. benchmarks/cpu/sql.py picks its producers' keys with it.
CREATE OR REPLACE FUNCTION fluxpg._partition_of(k text, t text, parts int) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT abs(hashtext(coalesce(nullif(k, ''), nullif(fluxpg.routing_key(t), ''))) % parts)
$$;

-- Queue ids whose topic bindings match a topic, in id order (the order heads are locked in).
CREATE OR REPLACE FUNCTION fluxpg.route(topic text) RETURNS int[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
  ids int[];
BEGIN
  -- plpgsql, not sql: a plpgsql function keeps its plan for the session, an SQL function with a
  -- CTE was planned again on every call (measured 395 µs vs 105 µs per publish, 3 queues).
  SELECT coalesce(array_agg(r.id ORDER BY r.id), '{}') INTO ids FROM fluxpg._routes(route.topic) r;
  RETURN ids;
END $$;

-- A reserved catch-all left by a run without configured queues (FluxMQ's `mqtt` on $queue/#) that
-- the current config does not list: it keeps its messages and its own $queue/<name>/# binding but
-- stops being reserved, so fluxpg.route and the broker agree it catches nothing else.
CREATE OR REPLACE FUNCTION fluxpg.retire_reserved(keep text[]) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues;
BEGIN
  FOR q IN UPDATE fluxpg.queues
              SET settings = jsonb_set(settings, '{reserved}', 'false'),
                  topics = ARRAY['$queue/' || name || '/#'], updated_at = now()
            WHERE coalesce((settings ->> 'reserved')::boolean, false) AND NOT (name = ANY (coalesce(keep, '{}')))
            RETURNING * LOOP
    PERFORM pg_notify('fluxpg_queues', q.id::text);
    RETURN NEXT q.name;
  END LOOP;
END $$;
COMMENT ON FUNCTION fluxpg.retire_reserved(text[]) IS 'Un-reserve the reserved queues not in keep (the configured ones) and bind each to its own $queue/<name>/# only; returns their names';

-- ---------------------------------------------------------------------------------------------
-- Append
-- ---------------------------------------------------------------------------------------------

-- Reserve k offsets in one queue partition: take the head row lock (held to commit, so appends
-- to a partition commit in seq order), enforce max_depth, and make sure
-- segments exist for the new rows (pre-creating the next one once the head reaches half of the
-- newest). Returns the first reserved offset.
CREATE OR REPLACE FUNCTION fluxpg._reserve(q fluxpg.queues, part int, k int) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  first bigint;
  floor_seq bigint;
  seg_end bigint;
  max_depth bigint := coalesce((q.settings #>> '{limits,max_depth}')::bigint, 0);
BEGIN
  UPDATE fluxpg.heads h SET next_seq = h.next_seq + k
   WHERE h.queue_id = q.id AND h.partition = part
  RETURNING h.next_seq - k, h.first_seq, h.segment_end INTO first, floor_seq, seg_end;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'FP001', MESSAGE = format('queue %L has no partition %s', q.name, part);
  END IF;
  IF q.kind = 'classic' AND max_depth > 0 AND first + k - floor_seq > max_depth
     AND q.settings #>> '{limits,overflow}' = 'drop-head' THEN
    -- Overflow drop-head (RabbitMQ x-overflow): the oldest messages not yet delivered make room.
    -- Groups' cursors and the retained floor move up to keep max_depth messages waiting;
    -- delivered, unacknowledged ones stay pending (they are not waiting any more).
    floor_seq := first + k - max_depth;
    UPDATE fluxpg.cursors c SET cursor = floor_seq
      FROM fluxpg.groups g
     WHERE g.id = c.group_id AND g.queue_id = q.id AND c.partition = part AND c.cursor < floor_seq;
    UPDATE fluxpg.heads SET first_seq = floor_seq
     WHERE queue_id = q.id AND partition = part AND first_seq < floor_seq;
    IF q.durability = 'transient' THEN
      PERFORM fluxpg._transient_trim(q, part, floor_seq);
    END IF;
  ELSIF max_depth > 0 AND first + k - floor_seq > max_depth THEN
    -- Only now pay for the exact floor: the slowest group's progress (classic: its lowest pending
    -- offset, else its cursor; stream: its committed offset). Without groups every retained
    -- message is waiting.
    IF q.kind = 'classic' THEN
      SELECT coalesce(min(coalesce((SELECT min(p.seq) FROM fluxpg.pending p
                                     WHERE p.group_id = c.group_id AND p.partition = c.partition), c.cursor)), floor_seq)
        INTO floor_seq
        FROM fluxpg.cursors c JOIN fluxpg.groups g ON g.id = c.group_id
       WHERE g.queue_id = q.id AND c.partition = part;
    ELSE
      SELECT greatest(coalesce(min(c.committed), floor_seq), floor_seq) INTO floor_seq
        FROM fluxpg.cursors c JOIN fluxpg.groups g ON g.id = c.group_id
       WHERE g.queue_id = q.id AND c.partition = part;
    END IF;
    IF first + k - floor_seq > max_depth THEN
      RAISE EXCEPTION USING ERRCODE = 'FP003',
        MESSAGE = format('queue %L is full: %s messages waiting, limits.max_depth is %s', q.name, first - floor_seq, max_depth);
    END IF;
  END IF;
  IF seg_end <= first + k + q.segment_size / 2 THEN
    PERFORM fluxpg._ensure_segments(q.id, part, first + k + q.segment_size / 2);
  END IF;
  RETURN first;
END $$;

-- When a message expires: the queue's message_ttl, or sooner when the message carries its own
-- (the per-message `x-amqp-expiration` in milliseconds, as AMQP 0-9-1 `expiration` is stored;
-- front-ends refuse values that are not digits). NULL: never. A SQL function, so the planner
-- inlines it into the append's INSERT.
CREATE OR REPLACE FUNCTION fluxpg._expires_at(ttl interval, h jsonb) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
  SELECT CASE WHEN h IS NOT NULL AND h ->> 'x-amqp-expiration' ~ '^[0-9]{1,15}$'
              THEN least(CASE WHEN ttl > interval '0' THEN now() + ttl END,
                         now() + ((h ->> 'x-amqp-expiration')::bigint * interval '1 millisecond'))
              WHEN ttl > interval '0' THEN now() + ttl END
$$;

CREATE OR REPLACE FUNCTION fluxpg._too_large(qname text, size bigint, lim bigint) RETURNS bytea
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION USING ERRCODE = '54000',
    MESSAGE = format('message of %s bytes exceeds limits.max_message_size %s of queue %L', size, lim, qname);
END $$;

-- ---------------------------------------------------------------------------------------------
-- Who is told of an append (NOTIFY fluxpg_log)
-- ---------------------------------------------------------------------------------------------
-- PostgreSQL signals every LISTENing backend of the database on each NOTIFY, whatever its channel,
-- and every broker node reads each notification: a NOTIFY per committed batch cost ~100 µs of CPU
-- per publish confirmed one at a time with nobody consuming elsewhere (sql/0015_log_watchers.sql).
-- So an append tagged by a node (notify_tag `,@<node>`: it wakes its own consumers itself) names
-- only the queues in fluxpg.log_watchers for another node or an unexpired SQL lease, and sends no
-- NOTIFY when there are none; an untagged append (applications, the SQL API) names them all.
-- Called after the heads are locked: a node that starts watching a queue waits for appends that
-- hold its heads (fluxpg._node_watches), so each append either sees the watcher row or commits
-- before the watcher's first claim.
CREATE OR REPLACE FUNCTION fluxpg._notify_log(queue_ids int[], notify_tag text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
  named int[];
BEGIN
  IF notify_tag IS NULL OR notify_tag = '' THEN
    named := queue_ids;
  ELSE
    named := ARRAY(SELECT DISTINCT w.queue_id FROM fluxpg.log_watchers w
                    WHERE w.queue_id = ANY (queue_ids)
                      AND w.watcher <> 'node:' || substr(notify_tag, 3)
                      AND (w.until IS NULL OR w.until > now())
                    ORDER BY 1);
    IF cardinality(named) = 0 THEN
      RETURN false;
    END IF;
  END IF;
  PERFORM pg_notify('fluxpg_log', array_to_string(named, ',') || coalesce(notify_tag, ''));
  RETURN true;
END $$;

-- The queues this node has consumers of, exactly (rows of the node for other queues go). Before
-- it returns, appends that hold a head of a newly watched queue have committed (their NOTIFY may
-- not have named it), so the node's first claim after this sees their rows; it waits at most
-- 200 ms for that (an application's fluxpg.append inside a long transaction holds a head until
-- it commits), after which the consumers' periodic claim covers the rest.
CREATE OR REPLACE FUNCTION fluxpg._node_watches(node int, queue_ids int[]) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
  added int[];
BEGIN
  DELETE FROM fluxpg.log_watchers
   WHERE node_id = node AND NOT (queue_id = ANY (coalesce(queue_ids, '{}')));
  WITH ins AS (
    INSERT INTO fluxpg.log_watchers (queue_id, watcher, node_id)
    SELECT q.id, 'node:' || node, node FROM fluxpg.queues q WHERE q.id = ANY (coalesce(queue_ids, '{}'))
    ON CONFLICT DO NOTHING
    RETURNING queue_id)
  SELECT array_agg(queue_id ORDER BY queue_id) INTO added FROM ins;
  IF added IS NOT NULL THEN
    BEGIN
      PERFORM set_config('lock_timeout', '200ms', true);
      PERFORM 1 FROM fluxpg.heads h WHERE h.queue_id = ANY (added) ORDER BY h.queue_id, h.partition FOR SHARE;
    EXCEPTION WHEN lock_not_available THEN
      NULL;
    END;
  END IF;
  RETURN coalesce(cardinality(added), 0);
END $$;

-- For applications that LISTEN on fluxpg_log themselves: appends by broker nodes NOTIFY a queue
-- only while someone watches it (fluxpg._notify_log). Call this before the first read and again
-- before the lease ends (e.g. on every wait); unwatch_log ends it. Appends through the SQL API
-- (untagged) always NOTIFY.
CREATE OR REPLACE FUNCTION fluxpg.watch_log(queue text, listener text DEFAULT NULL,
                                            lease interval DEFAULT interval '30 seconds')
RETURNS timestamptz LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue);
  who text := coalesce(nullif(listener, ''), 'pid:' || pg_backend_pid());
  ends timestamptz := now() + lease;
BEGIN
  IF lease IS NULL OR lease <= interval '0' OR who LIKE 'node:%' THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004',
      MESSAGE = format('watch_log: lease must be positive and the watcher name not start with "node:" (got %L, %L)', lease, who);
  END IF;
  INSERT INTO fluxpg.log_watchers AS w (queue_id, watcher, until) VALUES (q.id, who, ends)
  ON CONFLICT ON CONSTRAINT log_watchers_pkey DO UPDATE SET until = EXCLUDED.until;
  RETURN ends;
END $$;
COMMENT ON FUNCTION fluxpg.watch_log(text, text, interval) IS 'Ask broker nodes to NOTIFY fluxpg_log for the queue''s appends until the lease ends (for applications that LISTEN themselves); renew by calling again';

CREATE OR REPLACE FUNCTION fluxpg.unwatch_log(queue text, listener text DEFAULT NULL) RETURNS boolean
LANGUAGE sql AS $$
  WITH gone AS (
    DELETE FROM fluxpg.log_watchers w USING fluxpg.queues q
     WHERE q.name = queue AND w.queue_id = q.id AND w.node_id IS NULL
       AND w.watcher = coalesce(nullif(listener, ''), 'pid:' || pg_backend_pid())
    RETURNING 1)
  SELECT count(*) > 0 FROM gone
$$;
COMMENT ON FUNCTION fluxpg.unwatch_log(text, text) IS 'End a lease taken with fluxpg.watch_log';

-- Append a batch of rows (one per message and matching queue) in one transaction; returns each
-- input row's (ordinal, queue, partition, seq). Heads are locked in (queue_id, partition) order,
-- so concurrent batches never deadlock and appends to one partition commit in seq order.
-- keys[i] (optional) picks the partition of a partitioned queue by hash; without one the
-- routing key does, and without that a round robin. At most one NOTIFY per call
-- (fluxpg._notify_log); its payload ends in notify_tag: `,@<node>` when the calling node wakes its
-- own consumers itself (the broker's appender and sequencer, through fluxpg.append_claim and
-- fluxpg.sequence_claim, which take the tag from their caller too); then only queues another node
-- or a SQL listener watches are named, and without one no NOTIFY is sent.
CREATE OR REPLACE FUNCTION fluxpg.append_batch(queue_ids int[], topics text[], payloads bytea[],
                                               headers jsonb[] DEFAULT NULL, keys text[] DEFAULT NULL,
                                               notify_tag text DEFAULT NULL)
RETURNS TABLE (ord int, queue_id int, partition int, seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
  n int := cardinality(queue_ids);
  parts int[];
  q fluxpg.queues;
  r record;
  res_q int[] := '{}';
  res_p int[] := '{}';
  res_first bigint[] := '{}';
  res_ttl interval[] := '{}';
  res_lim bigint[] := '{}';
  res_name text[] := '{}';
  first bigint;
  ttl interval;
  lim bigint;
  missing int;
  notified boolean;
  part int;
BEGIN
  IF n IS NULL OR n = 0 THEN RETURN; END IF;
  IF cardinality(topics) <> n OR cardinality(payloads) <> n
     OR (headers IS NOT NULL AND cardinality(headers) <> n) OR (keys IS NOT NULL AND cardinality(keys) <> n) THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = 'append_batch: arrays must have the same length';
  END IF;

  IF queue_ids[1] = ALL (queue_ids) THEN
    SELECT * INTO q FROM fluxpg.queues WHERE id = queue_ids[1];
    IF NOT FOUND THEN
      RAISE EXCEPTION USING ERRCODE = 'FP001', MESSAGE = format('unknown queue id %s', queue_ids[1]);
    END IF;
    IF q.partitions = 1 THEN
      part := 0;
    ELSIF (keys IS NULL AND topics[1] = ALL (topics))
       OR (nullif(keys[1], '') IS NOT NULL AND keys[1] = ALL (keys)) THEN
      -- One partition key (or, without keys, one routing key) for the whole batch, a producer per
      -- key: every row's partition is the first's (NULL: no key at all, the round robin below).
      part := fluxpg._partition_of(keys[1], topics[1], q.partitions);
    END IF;
    IF part IS NOT NULL THEN
      -- The common case, one queue partition: no grouping, no window, one INSERT (a 4-partition
      -- stream with a producer per partition cost 18 µs of PostgreSQL CPU per message through
      -- the general path below, 10 through this one).
      first := fluxpg._reserve(q, part, n);
      ttl := fluxpg._interval(q.settings #>> '{limits,message_ttl}');
      lim := coalesce((q.settings #>> '{limits,max_message_size}')::bigint, 0);
      IF q.durability = 'transient' THEN
        PERFORM fluxpg._transient_charge(q, part, (SELECT sum(octet_length(pl)) FROM unnest(payloads) pl));
      END IF;
      -- The size limit is checked row by row inside the INSERT: a separate pass over the
      -- payload array would copy it again (measured: a third of the append's cost).
      INSERT INTO fluxpg.log (queue_id, partition, seq, topic, payload, headers, created_at, expires_at)
      SELECT q.id, part, first + u.i - 1, u.t,
             CASE WHEN lim > 0 AND octet_length(u.pl) > lim THEN fluxpg._too_large(q.name, octet_length(u.pl), lim) ELSE u.pl END,
             u.h, now(), fluxpg._expires_at(ttl, u.h)
        FROM unnest(topics, payloads, coalesce(headers, array_fill(NULL::jsonb, ARRAY[n])))
             WITH ORDINALITY AS u(t, pl, h, i);
      -- unnest, not generate_series(1, n): a generic plan estimates generate_series of parameters
      -- at 1,000 rows and unnest at 10, so with generate_series PostgreSQL re-planned this
      -- statement for every call (a custom plan always looked cheaper); the same below.
      RETURN QUERY SELECT u.i::int, q.id, part, first + u.i - 1 FROM unnest(queue_ids) WITH ORDINALITY AS u(x, i);
      -- An assignment is a simple expression; PERFORM would start an executor for it.
      notified := fluxpg._notify_log(ARRAY[q.id], notify_tag);
      RETURN;
    END IF;
  END IF;

  -- Partition of every row, decided once (the round robin uses random()).
  SELECT array_agg(CASE WHEN qq.partitions = 1 THEN 0
                        ELSE coalesce(fluxpg._partition_of(u.k, u.t, qq.partitions),
                                      ((u.i + rr.base) % qq.partitions)::int) END ORDER BY u.i)
    INTO parts
    FROM unnest(queue_ids, topics, coalesce(keys, array_fill(NULL::text, ARRAY[n])))
         WITH ORDINALITY AS u(qid, t, k, i)
    LEFT JOIN fluxpg.queues qq ON qq.id = u.qid
    CROSS JOIN (SELECT floor(random() * 1024)::int AS base) rr;
  IF array_position(parts, NULL) IS NOT NULL THEN
    SELECT u.qid INTO missing FROM unnest(queue_ids, parts) AS u(qid, p) WHERE u.p IS NULL LIMIT 1;
    RAISE EXCEPTION USING ERRCODE = 'FP001', MESSAGE = format('unknown queue id %s', missing);
  END IF;

  FOR r IN SELECT u.qid, u.p, count(*)::int AS k
             FROM unnest(queue_ids, parts) AS u(qid, p)
            GROUP BY u.qid, u.p ORDER BY u.qid, u.p
  LOOP
    SELECT * INTO q FROM fluxpg.queues WHERE id = r.qid;
    res_q := res_q || r.qid;
    res_p := res_p || r.p;
    res_first := res_first || fluxpg._reserve(q, r.p, r.k);
    IF q.durability = 'transient' THEN
      PERFORM fluxpg._transient_charge(q, r.p, (SELECT sum(octet_length(u.pl)) FROM unnest(queue_ids, parts, payloads) AS u(qid, p, pl)
                                                 WHERE u.qid = r.qid AND u.p = r.p));
    END IF;
    res_ttl := res_ttl || fluxpg._interval(q.settings #>> '{limits,message_ttl}');
    res_lim := res_lim || coalesce((q.settings #>> '{limits,max_message_size}')::bigint, 0);
    res_name := res_name || q.name;
  END LOOP;

  RETURN QUERY
  WITH rows AS (
    SELECT u.i::int AS i, u.qid, u.p,
           res.first + row_number() OVER (PARTITION BY u.qid, u.p ORDER BY u.i) - 1 AS s,
           u.t, u.pl, u.h, res.ttl, res.lim, res.name
      FROM unnest(queue_ids, parts, topics, payloads, coalesce(headers, array_fill(NULL::jsonb, ARRAY[n])))
           WITH ORDINALITY AS u(qid, p, t, pl, h, i)
      JOIN unnest(res_q, res_p, res_first, res_ttl, res_lim, res_name) AS res(qid, p, first, ttl, lim, name)
        ON res.qid = u.qid AND res.p = u.p
  ), ins AS (
    INSERT INTO fluxpg.log (queue_id, partition, seq, topic, payload, headers, created_at, expires_at)
    SELECT rows.qid, rows.p, rows.s, rows.t,
           CASE WHEN rows.lim > 0 AND octet_length(rows.pl) > rows.lim
                THEN fluxpg._too_large(rows.name, octet_length(rows.pl), rows.lim) ELSE rows.pl END,
           rows.h, now(), fluxpg._expires_at(rows.ttl, rows.h)
      FROM rows
  )
  SELECT rows.i, rows.qid, rows.p, rows.s FROM rows ORDER BY rows.i;

  notified := fluxpg._notify_log(ARRAY(SELECT DISTINCT x FROM unnest(res_q) x ORDER BY 1), notify_tag);
END $$;
COMMENT ON FUNCTION fluxpg.append_batch(int[], text[], bytea[], jsonb[], text[], text) IS 'Group-commit append of many messages to many queues in one transaction (used by the broker)';

-- Refuse a topic or payload no publish may carry: shared by the direct append and the
-- transactional publish so both refuse the same input the same way.
CREATE OR REPLACE FUNCTION fluxpg._check_publish(topic text, payload bytea) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  IF topic IS NULL OR topic = '' OR topic ~ '[+#\x00]' THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = format('invalid topic %L: a topic name has no wildcards', topic);
  END IF;
  IF payload IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = 'payload must not be NULL (use an empty bytea)';
  END IF;
END $$;

CREATE OR REPLACE FUNCTION fluxpg._no_route(topic text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION USING ERRCODE = 'FP001', MESSAGE = format('no queue is bound to topic %L', topic),
    HINT = 'declare a queue whose topics match it, e.g. $queue/<name>/#';
END $$;

-- The queues a publish to `topic` reaches, after checking the topic and payload.
CREATE OR REPLACE FUNCTION fluxpg._publish_targets(topic text, payload bytea) RETURNS int[]
LANGUAGE plpgsql AS $$
DECLARE
  ids int[];
BEGIN
  PERFORM fluxpg._check_publish(topic, payload);
  ids := fluxpg.route(topic);
  IF cardinality(ids) = 0 THEN
    PERFORM fluxpg._no_route(topic);
  END IF;
  RETURN ids;
END $$;

-- The direct append: offsets are assigned at once, so it takes each queue's head row lock and holds
-- it until the caller's transaction ends. Right for autocommit callers (the CLI, tools, tests that
-- need the offset back); inside a longer transaction use fluxpg.publish().
CREATE OR REPLACE FUNCTION fluxpg.append(topic text, payload bytea, headers jsonb DEFAULT NULL)
RETURNS TABLE (queue text, seq bigint) LANGUAGE plpgsql AS $$
DECLARE
  ids int[] := fluxpg._publish_targets(topic, payload);
  k int := cardinality(ids);
BEGIN
  RETURN QUERY
  SELECT q.name, a.seq
    FROM fluxpg.append_batch(ids, array_fill(topic, ARRAY[k]), array_fill(payload, ARRAY[k]),
                             array_fill(headers, ARRAY[k]), array_fill(headers ->> 'x-partition-key', ARRAY[k])) a
    JOIN fluxpg.queues q ON q.id = a.queue_id
   ORDER BY a.ord;
END $$;
COMMENT ON FUNCTION fluxpg.append(text, bytea, jsonb) IS 'Append a message to every queue whose topics match and return (queue, offset) per queue; holds the queues'' head locks until the transaction ends (use fluxpg.publish inside application transactions)';

-- ---------------------------------------------------------------------------------------------
-- Publishing inside the caller's transaction (the outbox without a relay)
-- ---------------------------------------------------------------------------------------------
-- fluxpg.publish() INSERTs the message into fluxpg.outbox, in the caller's transaction, without
-- touching the queue's head row: an application transaction of any length blocks no other
-- publisher. At the caller's commit the deferred trigger outbox_commit (sql/0013_outbox_once.sql)
-- inserts the transaction's marker into fluxpg.outbox_commits, its cseq taken then, so cseq follows
-- commit order; the sequencer (fluxpg.sequence_staged(), run by the brokers) appends the
-- transactions' messages to the log in that order in short transactions of its own. So offsets
-- follow commit order, a rollback leaves no trace and no gap, each message is written once by
-- its publisher, and publishing transactions commit in parallel (they send no NOTIFY unless the
-- sequencer sleeps). Each publishing transaction also holds a shared advisory lock per target
-- queue (key 1179669332 = 'FPST', queue id) until it ends: queue_stats counts those to show how
-- many open transactions have messages waiting, and the oldest's age.

-- The commit-time trigger of fluxpg.outbox (created by revision 0013, replaced here in place):
-- the first row of each fluxpg.publish call adds its transaction's commit-order marker.
-- Waking the sequencer: publishing commits send no NOTIFY while a sequencer polls (one per commit
-- would serialise the commits on PostgreSQL's notification lock), only while one sleeps. A
-- sleeping sequencer holds the advisory lock (1179669332, -1) exclusively (fluxpg/queues/
-- sequencer.py); then this shared try-lock fails and this commit NOTIFYs fluxpg_outbox. When it
-- succeeds, it is held until this commit has ended, so a sequencer cannot start to sleep between
-- this check and the moment this marker becomes visible: it takes the lock, then looks once more.
CREATE OR REPLACE FUNCTION fluxpg._outbox_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO fluxpg.outbox_commits (txid) VALUES (NEW.txid);
  IF NOT pg_try_advisory_xact_lock_shared(1179669332, -1) THEN
    PERFORM pg_notify('fluxpg_outbox', '');
  END IF;
  RETURN NULL;
END $$;

-- Route, then stage. Each statement and each plpgsql call in the publisher's transaction is CPU
-- the publisher pays, and per transaction it pays each statement's executor start-up (the plans
-- are cached; 8 connections, backend CPU per transaction from /proc): the earlier single
-- statement (routing CTE with two window aggregates, a LATERAL lock, a sort, the INSERT and the
-- result scan) cost ~60 µs more per transaction than this. So: the topic check is a simple
-- expression (the plpgsql call only when it fails); one routing query into arrays (the reserved
-- rule applied to them only when a reserved queue matched, not as a window over every match);
-- for one queue, the common case, a shared lock taken as a simple expression and an
-- INSERT ... VALUES; the result rows returned without a query. One row per target queue, in
-- queue id order; only the first carries `marks`, so its commit-time trigger runs once per call,
-- not once per message. Refuses what could never be appended (too large) now, when the caller can
-- still react.
CREATE OR REPLACE FUNCTION fluxpg.publish(topic text, payload bytea, headers jsonb DEFAULT NULL)
RETURNS TABLE (queue text, seq bigint) LANGUAGE plpgsql AS $$
DECLARE
  ids int[];
  names text[];
  lims bigint[];
  res boolean[];
  durable boolean;
  locked boolean;
  version bigint;
  cached text[];
  setting text;
BEGIN
  IF topic IS NULL OR topic = '' OR topic ~ '[+#\x00]' OR payload IS NULL THEN
    PERFORM fluxpg._check_publish(topic, payload);  -- raises
  END IF;
  -- The session's last route, when it went to one queue and this is its topic, while the routing
  -- version (fluxpg._route_version(), sql/0017_route_version.sql) is still the one it was computed
  -- at. Routing over every queue's bindings was ~44 µs of a ~285 µs one-message transaction with
  -- four queues; the version is a constant PostgreSQL inlined into this comparison's plan and
  -- re-plans when a routing change replaces it (seen at this transaction's start, or later), so
  -- the check costs a comparison. (Read from a table, fluxpg.route_changes of revision 0016, it
  -- was a second relation in every call: 15-20 µs.) A payload over the cached limit goes the
  -- full way, so that an error is only ever raised from the current routing table. The cache is
  -- the session's own settings (fluxpg.route_topic, fluxpg.route): whoever can set them can call
  -- fluxpg.append_batch with any queue id too.
  IF current_setting('fluxpg.route_topic', true) = topic THEN
    cached := string_to_array(current_setting('fluxpg.route', true), E'\x1f');  -- version, id, limit, name
    IF cached[1]::bigint = fluxpg._route_version()
       AND (cached[3]::bigint = 0 OR octet_length(payload) <= cached[3]::bigint) THEN
      locked := pg_advisory_xact_lock_shared(1179669332, cached[2]::int) IS NULL;
      INSERT INTO fluxpg.outbox (queue_id, topic, payload, headers, part_key, marks)
      VALUES (cached[2]::int, publish.topic, publish.payload, publish.headers, publish.headers ->> 'x-partition-key', true);
      queue := array_to_string(cached[4:], E'\x1f');
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;
  -- fluxpg._routes without its window and sort: one match (the common case) needs neither;
  -- several are put in id order here, and reserved queues only take what no other queue does.
  -- The routing version is the constant this statement's plan holds: planned (or found valid)
  -- before its snapshot is taken, so the bindings read are those of that version or newer, never
  -- older (a newer one only costs the next call a miss).
  SELECT array_agg(q.id), array_agg(q.name), array_agg(coalesce((q.settings #>> '{limits,max_message_size}')::bigint, 0)),
         array_agg(coalesce((q.settings ->> 'reserved')::boolean, false)), bool_and(q.durability = 'durable'),
         fluxpg._route_version()
    INTO ids, names, lims, res, durable, version
    FROM fluxpg.queues q
   WHERE EXISTS (SELECT 1 FROM unnest(q.topics) f WHERE fluxpg.topic_matches(f, publish.topic));
  IF ids IS NULL THEN
    PERFORM fluxpg._no_route(topic);  -- raises
  END IF;
  IF cardinality(ids) > 1 THEN
    SELECT array_agg(u.id ORDER BY u.id), array_agg(u.name ORDER BY u.id), array_agg(u.lim ORDER BY u.id)
      INTO ids, names, lims
      FROM unnest(ids, names, lims, res) AS u(id, name, lim, reserved)
     WHERE NOT u.reserved OR NOT (false = ANY (res));
  END IF;
  -- The offset is assigned when the caller commits. The shared lock per target queue (key
  -- 1179669332, queue id), held until the transaction ends, is what queue_stats counts.
  IF cardinality(ids) = 1 THEN
    -- The route kept for the next publish of this topic: session settings, not transaction-local
    -- (a rollback takes them back, like any setting). Only a route no change left out of the
    -- version can alter: to a durable queue, for a topic outside $queue/ or under that queue's
    -- own $queue/<name>/ (a transient queue, created and deleted without a new version, binds
    -- $queue/<its name>/# alone, and cannot take a name a queue holds). And only under READ
    -- COMMITTED: a REPEATABLE READ snapshot can be older than the version, and the route would
    -- pass for a routing table newer than the one it was read from.
    IF durable AND (left(topic, 7) <> '$queue/' OR split_part(topic, '/', 2) = names[1])
       AND current_setting('transaction_isolation') = 'read committed' THEN
      setting := set_config('fluxpg.route_topic', topic, false);
      setting := set_config('fluxpg.route', concat_ws(E'\x1f', version, ids[1], lims[1], names[1]), false);
    END IF;
    IF lims[1] > 0 AND octet_length(payload) > lims[1] THEN
      PERFORM fluxpg._too_large(names[1], octet_length(payload), lims[1]);  -- raises
    END IF;
    locked := pg_advisory_xact_lock_shared(1179669332, ids[1]) IS NULL;  -- a simple expression, not a query
    INSERT INTO fluxpg.outbox (queue_id, topic, payload, headers, part_key, marks)
    VALUES (ids[1], publish.topic, publish.payload, publish.headers, publish.headers ->> 'x-partition-key', true);
  ELSE
    INSERT INTO fluxpg.outbox (queue_id, topic, payload, headers, part_key, marks)
    SELECT u.id, publish.topic,
           CASE WHEN u.lim > 0 AND octet_length(publish.payload) > u.lim
                THEN fluxpg._too_large(u.name, octet_length(publish.payload), u.lim) ELSE publish.payload END,
           publish.headers, publish.headers ->> 'x-partition-key', u.k = 1
      FROM unnest(ids, names, lims) WITH ORDINALITY AS u(id, name, lim, k)
      CROSS JOIN LATERAL (SELECT pg_advisory_xact_lock_shared(1179669332, u.id)) l
     ORDER BY u.k;
  END IF;
  seq := NULL;
  FOREACH queue IN ARRAY names LOOP
    RETURN NEXT;
  END LOOP;
END $$;
COMMENT ON FUNCTION fluxpg.publish(text, bytea, jsonb) IS 'Publish a message to every queue whose topics match, inside the caller''s transaction: appended when it commits, in commit order, blocking no other publisher meanwhile. Returns (queue, NULL): the offset is assigned at commit (fluxpg.append returns it at once but holds the head lock until the transaction ends)';

CREATE OR REPLACE FUNCTION fluxpg.publish_batch(topics text[], payloads bytea[], headers jsonb[] DEFAULT NULL)
RETURNS TABLE (ord int, queue text) LANGUAGE plpgsql AS $$
DECLARE
  n int := cardinality(topics);
  ords int[];
  names text[];
  unrouted int;
BEGIN
  IF n IS NULL OR n = 0 THEN RETURN; END IF;
  IF cardinality(payloads) <> n OR (headers IS NOT NULL AND cardinality(headers) <> n) THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = 'publish_batch: arrays must have the same length';
  END IF;
  FOR i IN 1 .. n LOOP
    PERFORM fluxpg._check_publish(topics[i], payloads[i]);
  END LOOP;
  WITH m AS (SELECT u.i::int AS i, u.t, u.p, u.h FROM unnest(topics, payloads, coalesce(headers, array_fill(NULL::jsonb, ARRAY[n])))
                                                   WITH ORDINALITY AS u(t, p, h, i)),
       t AS (SELECT m.i, m.t, m.p, m.h, r.id, r.name, r.max_message_size AS lim,
                    row_number() OVER (ORDER BY m.i, r.id) AS k
               FROM m CROSS JOIN LATERAL fluxpg._routes(m.t) r),
       ins AS (INSERT INTO fluxpg.outbox (queue_id, topic, payload, headers, part_key, marks)
               SELECT t.id, t.t,
                      CASE WHEN t.lim > 0 AND octet_length(t.p) > t.lim
                           THEN fluxpg._too_large(t.name, octet_length(t.p), t.lim) ELSE t.p END,
                      t.h, t.h ->> 'x-partition-key', t.k = 1
                 FROM t CROSS JOIN LATERAL (SELECT pg_advisory_xact_lock_shared(1179669332, t.id)) l
                ORDER BY t.k)
  SELECT array_agg(t.i ORDER BY t.k), array_agg(t.name ORDER BY t.k) INTO ords, names FROM t;
  SELECT min(g) INTO unrouted FROM generate_series(1, n) g WHERE NOT (g = ANY (coalesce(ords, '{}')));
  IF unrouted IS NOT NULL THEN
    PERFORM fluxpg._no_route(topics[unrouted]);
  END IF;
  RETURN QUERY SELECT u.o, u.q FROM unnest(ords, names) AS u(o, q);
END $$;
COMMENT ON FUNCTION fluxpg.publish_batch(text[], bytea[], jsonb[]) IS 'fluxpg.publish for many messages (in order) in the caller''s transaction; returns (ordinal, queue) per queue reached';

-- Append one committed outbox message (transaction tx, id one) to the log and delete it; returns
-- its queue id (empty: it was not there). The slow path of fluxpg._sequence (a queue refused the
-- whole batch goes message by message, so a batch larger than the room left still progresses):
-- the DELETE through the (txid, id) primary key returns the row it appends.
CREATE OR REPLACE FUNCTION fluxpg._append_outbox(tx xid8, one bigint, notify_tag text) RETURNS int[]
LANGUAGE plpgsql AS $$
DECLARE
  r record;
BEGIN
  DELETE FROM fluxpg.outbox o WHERE o.txid = tx AND o.id = one
  RETURNING o.queue_id, o.topic, o.payload, o.headers, o.part_key INTO r;
  IF NOT FOUND THEN RETURN '{}'; END IF;
  PERFORM fluxpg.append_batch(ARRAY[r.queue_id], ARRAY[r.topic], ARRAY[r.payload], ARRAY[r.headers],
                              ARRAY[r.part_key], notify_tag);
  RETURN ARRAY[r.queue_id];
END $$;

-- Append committed outbox messages to the log, in commit order (fluxpg.outbox_commits.cseq),
-- the transactions of the first max_rows markers per call. One sequencer at a time (a transaction-scoped
-- advisory lock; a second caller waits, then sees what committed meanwhile), so offsets follow
-- that order across nodes. A queue whose append fails (full, for instance) keeps its messages, in
-- order, with the error, while the other queues' messages move on; a transaction's marker goes
-- when its last message has; messages of a queue that no longer exists are discarded with it.
-- notify_tag: as fluxpg.append_batch's (NULL: untagged).
--
-- Which transactions may be numbered: every one whose marker this call sees, i.e. that has
-- committed. A transaction still committing (marker cseq taken, commit not yet visible) is
-- numbered by a later call, after the ones seen now: offsets only ever grow, and a consumer at
-- offset N never later finds a message below N. Two transactions whose commits overlap are
-- appended in the order they became visible, which is a commit order.
--
-- Returns the queue id of every message appended, in append order (moved); when everything went
-- in one append (the fast path, the common case) also each one's offset and the message itself
-- (seqs, topics, payloads, hdrs: what fluxpg._handoff_claims needs to hand a waiting consumer the
-- messages without reading them back from the log), else those are NULL.
-- fluxpg.sequence_staged (the SQL API) returns how many; fluxpg.sequence_claim (the broker's
-- sequencer) also claims for its waiting consumers in the same transaction.
-- The fast path is few statements on purpose: each is an executor start-up (and a plan check)
-- on every round, and a round's fixed cost is most of what a message published at a low rate
-- waits for (issue 15's end-to-end latency).
CREATE OR REPLACE FUNCTION fluxpg._sequence(max_rows int, notify_tag text DEFAULT NULL,
                                            OUT moved int[], OUT seqs bigint[], OUT topics text[],
                                            OUT payloads bytea[], OUT hdrs jsonb[])
LANGUAGE plpgsql AS $$
DECLARE
  n int;
  qid int;
  r record;
  txids xid8[];
  marks tid[];
  keys text[];
  locked boolean;
BEGIN
  moved := '{}';
  locked := pg_advisory_xact_lock(1179669332, 0) IS NULL;  -- one at a time (above); a simple expression
  -- The markers, oldest first, and their transactions in the order of each one's first marker (a
  -- transaction has one per fluxpg.publish call, all taken at its commit). Through the primary
  -- key (a sequential scan would read every dead marker not yet vacuumed). Read under the lock,
  -- so only this transaction deletes them until it ends and their row addresses stay theirs:
  -- they are deleted below by address (a TID scan), not looked up by key again (an index
  -- descent per marker; the whole move of a 1,000-message round went from 16.5 to 10.3 µs of
  -- backend CPU per message). A marker left beyond max_rows by a transaction moved here finds
  -- no rows next time and goes then.
  SELECT array_agg(c.ctid), array_agg(c.txid ORDER BY c.cseq) INTO marks, txids
    FROM (SELECT c.ctid, c.cseq, c.txid FROM fluxpg.outbox_commits c ORDER BY c.cseq LIMIT max_rows) c;
  IF marks IS NULL THEN RETURN; END IF;
  IF cardinality(txids) > 1 THEN
    -- Each transaction once, where its first marker is (a window over the markers instead cost
    -- ~50 µs a round more than this).
    txids := ARRAY(SELECT u.t FROM unnest(txids) WITH ORDINALITY AS u(t, k) GROUP BY u.t ORDER BY min(u.k));
  END IF;
  -- Fast path: everything in one append (one head lock per queue partition, one NOTIFY). The
  -- DELETE returns the rows it takes (through the primary key, the array whole); one sort puts
  -- them in commit order for all five aggregates.
  BEGIN
    WITH d AS (DELETE FROM fluxpg.outbox o WHERE o.txid = ANY (txids)
               RETURNING o.txid, o.id, o.queue_id, o.topic, o.payload, o.headers, o.part_key)
    SELECT array_agg(d.queue_id), array_agg(d.topic), array_agg(d.payload), array_agg(d.headers), array_agg(d.part_key)
      INTO moved, topics, payloads, hdrs, keys
      FROM (SELECT d.queue_id, d.topic, d.payload, d.headers, d.part_key
              FROM d JOIN unnest(txids) WITH ORDINALITY AS m(txid, k) ON m.txid = d.txid
             ORDER BY m.k, d.id) d;
    IF moved IS NULL THEN
      moved := '{}';   -- another sequencer moved them meanwhile
    ELSE
      -- append_batch returns one row per input row; seqs[i] must be the offset of message i
      -- (the handoff pairs them with topics[i], payloads[i]): ordered by the ordinal, not by the
      -- order the rows happen to come back in.
      seqs := ARRAY(SELECT a.seq FROM fluxpg.append_batch(moved, topics, payloads, hdrs, keys, notify_tag) a ORDER BY a.ord);
    END IF;
    DELETE FROM fluxpg.outbox_commits c WHERE c.ctid = ANY (marks);
    RETURN;
  EXCEPTION WHEN OTHERS THEN
    moved := '{}'; seqs := NULL; topics := NULL; payloads := NULL; hdrs := NULL;
    -- some queue refused (all rolled back): go queue by queue below
  END;
  -- Slow path, queue by queue and message by message (a batch larger than the room left in a
  -- queue must still make progress), stopping at a queue's first refusal to keep its order.
  FOR qid IN SELECT DISTINCT o.queue_id FROM fluxpg.outbox o WHERE o.txid = ANY (txids) ORDER BY 1 LOOP
    IF NOT EXISTS (SELECT 1 FROM fluxpg.queues WHERE id = qid) THEN
      DELETE FROM fluxpg.outbox o WHERE o.queue_id = qid AND o.txid = ANY (txids);
      GET DIAGNOSTICS n = ROW_COUNT;
      RAISE WARNING 'fluxpg: discarded % outbox messages of deleted queue id %', n, qid;
      CONTINUE;
    END IF;
    FOR r IN SELECT m.txid, o.id FROM unnest(txids) WITH ORDINALITY AS m(txid, k)
               CROSS JOIN LATERAL (SELECT o.id FROM fluxpg.outbox o WHERE o.txid = m.txid AND o.queue_id = qid OFFSET 0) o
              ORDER BY m.k, o.id LOOP
      BEGIN
        moved := moved || fluxpg._append_outbox(r.txid, r.id, notify_tag);
      EXCEPTION WHEN OTHERS THEN
        UPDATE fluxpg.outbox o SET attempts = o.attempts + 1, last_error = SQLERRM
         WHERE o.queue_id = qid AND o.txid = ANY (txids);
        EXIT;
      END;
    END LOOP;
  END LOOP;
  -- Markers go with their transaction's last message.
  DELETE FROM fluxpg.outbox_commits c
   WHERE c.ctid = ANY (marks) AND NOT EXISTS (SELECT 1 FROM fluxpg.outbox o WHERE o.txid = c.txid);
END $$;

CREATE OR REPLACE FUNCTION fluxpg.sequence_staged(max_rows int DEFAULT 5000) RETURNS int
LANGUAGE plpgsql AS $$
BEGIN
  RETURN cardinality((fluxpg._sequence(max_rows)).moved);
END $$;
COMMENT ON FUNCTION fluxpg.sequence_staged(int) IS 'Append messages of committed fluxpg.publish() transactions to the log in commit order (the brokers run it; call it yourself when no broker runs)';

-- The broker's sequencer: fluxpg.sequence_staged plus, in the same transaction (committed
-- asynchronously, as the move is), claims for the calling node's consumers waiting on the queues
-- it appended to (fluxpg.append_claim's handoff, direct when the round went in one append: the
-- message reaches such a consumer with the move's commit instead of after a NOTIFY and a claim
-- transaction of its own). Rows: one per queue appended to (target 0, the queue id, r_seq = how
-- many messages), then target i's claimed messages.
-- notify_tag: as fluxpg.append_batch's (NULL: untagged). The caller passes `,@<node>` only when it
-- wakes its node's consumers of the moved queues itself (the broker's LocalHandoff, which does
-- that wake-up, holds the tag): not derived here from the connection's fluxpg.node_id, so a
-- caller that wakes nobody cannot have the NOTIFY for that node's consumers suppressed.
-- Committed asynchronously: the sequencer only moves rows that are already durable (the outbox,
-- committed by the application), and its delete from the outbox, append to the log and claims
-- commit or vanish together. A crash before the WAL writer flushed it leaves the rows in the outbox
-- to be moved (and delivered) again — at least once; anything durable that depends on the move (an
-- ack, a committed offset) flushes the WAL up to and including it first. Saves one WAL flush per
-- move: the end-to-end latency of the transactional path.
CREATE OR REPLACE FUNCTION fluxpg.sequence_claim(max_rows int, c_queues text[], c_groups text[],
                                                 c_consumers text[], c_n int[], notify_tag text DEFAULT NULL)
RETURNS TABLE (r_target int, r_queue_id int, r_partition int, r_seq bigint, r_topic text,
               r_payload bytea, r_headers jsonb, r_created_at timestamptz, r_delivery_count int)
LANGUAGE plpgsql AS $$
DECLARE
  m record;
  setting text;
BEGIN
  -- Assignments are simple expressions; a PERFORM is a query with its executor start-up (each
  -- one a few µs of every round, empty polls included).
  setting := set_config('synchronous_commit', 'off', true);
  m := fluxpg._sequence(max_rows, notify_tag);
  IF cardinality(m.moved) > 0 THEN
    RETURN QUERY SELECT 0, u.qid, NULL::int, count(*), NULL::text, NULL::bytea, NULL::jsonb, NULL::timestamptz, NULL::int
                   FROM unnest(m.moved) AS u(qid) GROUP BY u.qid;
    IF cardinality(c_queues) > 0 THEN
      RETURN QUERY SELECT * FROM fluxpg._handoff_claims(c_queues, c_groups, c_consumers, c_n,
                                                        ARRAY(SELECT DISTINCT unnest(m.moved)),
                                                        m.moved, m.seqs, m.topics, m.payloads, m.hdrs);
    END IF;
  END IF;
END $$;
COMMENT ON FUNCTION fluxpg.sequence_claim(int, text[], text[], text[], int[], text) IS 'fluxpg.sequence_staged plus claims for the calling node''s waiting consumers in the same transaction (used by the broker''s sequencer); returns (0, queue id, count) per queue appended to, then (target, message) per claim; notify_tag as fluxpg.append_batch''s';

-- Per queue: committed outbox messages waiting for the sequencer, open transactions holding
-- messages published to it (their shared staging locks; their rows are invisible until commit),
-- and the oldest such transaction's age.
CREATE OR REPLACE FUNCTION fluxpg._staging(qid int, OUT outbox bigint, OUT staging_transactions int,
                                           OUT oldest_staging_age interval)
LANGUAGE plpgsql STABLE AS $$
BEGIN
  SELECT count(*) INTO outbox FROM fluxpg.outbox o WHERE o.queue_id = qid;
  SELECT count(*), now() - min(a.xact_start) INTO staging_transactions, oldest_staging_age
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
   WHERE l.locktype = 'advisory' AND l.classid = 1179669332::oid AND l.objid = qid::oid
     AND l.objsubid = 2 AND l.granted;
END $$;

-- ---------------------------------------------------------------------------------------------
-- Dead letters
-- ---------------------------------------------------------------------------------------------

-- The dead-letter queue of a queue: `$dlq/<queue>`, created on first use. It never expires or
-- fills up (max_depth 0, message_ttl 0) and has no DLQ of its own.
-- The dead-letter queue of a queue: dlq.topic when set (a queue name, see declare_queue), else
-- $dlq/<queue>. Not routed as a topic: config, SQL and broker all read it as the DLQ's name.
CREATE OR REPLACE FUNCTION fluxpg.dlq_name(queue text) RETURNS text
LANGUAGE sql STABLE AS $$
  SELECT coalesce(nullif(q.settings #>> '{dlq,topic}', ''), '$dlq/' || q.name) FROM fluxpg.queues q WHERE q.name = dlq_name.queue
$$;
COMMENT ON FUNCTION fluxpg.dlq_name(text) IS 'The dead-letter queue of a queue: its dlq.topic when set, else $dlq/<queue> (NULL for an unknown queue)';

CREATE OR REPLACE FUNCTION fluxpg._dlq_queue(q fluxpg.queues) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
  id int;
  dname text := coalesce(nullif(q.settings #>> '{dlq,topic}', ''), '$dlq/' || q.name);
BEGIN
  SELECT queues.id INTO id FROM fluxpg.queues WHERE name = dname;
  IF FOUND THEN RETURN id; END IF;
  -- $dlq/<name> is bound to its own name only; a plain name gets the usual $queue/<name>/#.
  -- if_absent: a queue of that name declared since the look-up above (dlq.topic may name any
  -- queue) keeps its settings.
  RETURN fluxpg.declare_queue(dname, 'classic', CASE WHEN dname LIKE '$dlq/%' THEN ARRAY[dname] END,
    jsonb_build_object('limits', jsonb_build_object('max_depth', 0, 'message_ttl', '0',
                                                    'max_message_size', q.settings #> '{limits,max_message_size}'),
                       'dlq', jsonb_build_object('enabled', false)),
    if_absent => true);
END $$;

-- Move pending messages of a group to the DLQ (or drop them when the DLQ is disabled) and remove
-- their pending entries, in the caller's transaction: the append and the delete commit together.
CREATE OR REPLACE FUNCTION fluxpg._dead_letter(q fluxpg.queues, g fluxpg.groups, part int, seqs bigint[], reason text)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
  targets int[];
  moved_at text := to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
  k int;
  moved int;   -- NULL: the DLQ is disabled, nothing to move
BEGIN
  IF coalesce((q.settings #>> '{dlq,enabled}')::boolean, true) THEN
    targets := ARRAY[fluxpg._dlq_queue(q)];
    PERFORM fluxpg.append_batch(array_agg(t.id ORDER BY m.seq, t.id), array_agg(m.topic ORDER BY m.seq, t.id),
                                array_agg(m.payload ORDER BY m.seq, t.id), array_agg(m.h ORDER BY m.seq, t.id))
      FROM (SELECT l.seq, l.topic, l.payload,
                   coalesce(l.headers, '{}') || jsonb_build_object(
                     '_dlq_original_queue', q.name, '_dlq_original_topic', l.topic,
                     '_dlq_original_id', q.name || ':' || l.seq, '_dlq_original_offset', l.seq,
                     '_dlq_group', g.name, '_dlq_delivery_count', coalesce(p.delivery_count, 0),
                     '_dlq_reason', coalesce(reason, 'rejected'), '_dlq_moved_at', moved_at) AS h
              FROM fluxpg.log l
              LEFT JOIN fluxpg.pending p ON p.group_id = g.id AND p.partition = part AND p.seq = l.seq
             WHERE l.queue_id = q.id AND l.partition = part AND l.seq BETWEEN fluxpg._lo(seqs) AND fluxpg._hi(seqs) AND l.seq = ANY (seqs)) m
      CROSS JOIN unnest(targets) AS t(id)
    HAVING count(*) > 0;
    GET DIAGNOSTICS moved = ROW_COUNT;   -- append_batch's rows: one per message moved
  END IF;
  DELETE FROM fluxpg.pending WHERE group_id = g.id AND partition = part AND seq BETWEEN fluxpg._lo(seqs) AND fluxpg._hi(seqs) AND seq = ANY (seqs);
  GET DIAGNOSTICS k = ROW_COUNT;
  IF moved < k THEN
    -- A pending message whose row this backend could not read (a stale list of fluxpg.log's
    -- partitions, see _lock_log_for_new_queue) would leave its group without reaching the DLQ:
    -- fail instead, so the whole settlement rolls back and the message stays pending.
    RAISE EXCEPTION USING ERRCODE = 'object_not_in_prerequisite_state',
      MESSAGE = format('dead-lettering %s of queue %L: %s pending message(s) but %s log row(s) read; left pending',
                       seqs, q.name, k, moved);
  END IF;
  IF q.durability = 'transient' THEN
    PERFORM fluxpg._transient_forget(q, g, part, seqs);
  END IF;
  RETURN k;
END $$;

-- Has any message of this queue been redriven (table of migration 0006)? plpgsql, so a database
-- without the table (functions.sql runs before 0006; a downgrade drops it) still claims.
CREATE OR REPLACE FUNCTION fluxpg._has_redriven(qid int) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF to_regclass('fluxpg.redriven') IS NULL THEN RETURN false; END IF;
  RETURN EXISTS (SELECT 1 FROM fluxpg.redriven r WHERE r.queue_id = qid);
END $$;

CREATE OR REPLACE FUNCTION fluxpg._is_redriven(qid int, part int, s bigint) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN EXISTS (SELECT 1 FROM fluxpg.redriven r WHERE r.queue_id = qid AND r.partition = part AND r.seq = s);
END $$;

-- Offsets of a queue partition that are still "in" it: from the retained start, or for a queue
-- with groups from the lowest committed offset (below it every group acknowledged), minus the
-- redriven ones. The floor of that range:
-- (plpgsql: the view it reads is created after this file.)
CREATE OR REPLACE FUNCTION fluxpg._live_floor(q fluxpg.queues, part int) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN (SELECT greatest(h.first_seq,
                          coalesce((SELECT min(gp.committed) FROM fluxpg._group_progress gp
                                     WHERE gp.queue_id = q.id AND gp.partition = part), h.first_seq))
            FROM fluxpg.heads h WHERE h.queue_id = q.id AND h.partition = part);
END $$;

-- Redriven offsets of a queue partition at or above a floor: they left the queue (fluxpg.redrive),
-- so its depth does not count them. plpgsql for the same reason as _has_redriven.
CREATE OR REPLACE FUNCTION fluxpg._redriven_since(qid int, part int, floor bigint) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF to_regclass('fluxpg.redriven') IS NULL THEN RETURN 0; END IF;
  RETURN (SELECT count(*) FROM fluxpg.redriven r WHERE r.queue_id = qid AND r.partition = part AND r.seq >= floor);
END $$;

-- Move dead letters back to the queue they came from, as new messages (redrive). Which ones:
-- `offsets`, or every offset in [from_offset, to_offset) (NULL ends: all). Only messages still in
-- the DLQ count: retained, not acknowledged by every group of the DLQ, not pending (a DLQ
-- consumer is handling it), not redriven before. Each goes to `_dlq_original_queue` (else the
-- queue the DLQ is named after) with its original topic, payload and headers, plus
-- `_redriven_from` (<dlq>:<offset>), `_redriven_at` and `_redrive_count`. The new copies and the
-- fluxpg.redriven rows that take the originals out of the DLQ commit together: every snapshot
-- sees a message in exactly one of the two queues.
-- Redrives of one DLQ, and claims from it, are serialised by the DLQ groups' cursor rows and an
-- advisory lock. Returns how many messages moved (with dry_run: would move).
CREATE OR REPLACE FUNCTION fluxpg.redrive(dlq text, offsets bigint[] DEFAULT NULL, from_offset bigint DEFAULT NULL,
                                          to_offset bigint DEFAULT NULL, dry_run boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(dlq, 'classic', 'redrive');
  lo bigint;
  hi bigint;
  s_arr bigint[];
  t_arr int[];
  topic_arr text[];
  p_arr bytea[];
  h_arr jsonb[];
  missing text;
  moved_at text := to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
  n bigint;
BEGIN
  IF offsets IS NOT NULL AND (from_offset IS NOT NULL OR to_offset IS NOT NULL) THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = 'redrive: give offsets or a range (from_offset, to_offset), not both';
  END IF;
  IF offsets IS NOT NULL AND cardinality(offsets) = 0 THEN RETURN 0; END IF;
  -- Claims of the DLQ's groups lock their cursor row first (fluxpg._window): holding them, no
  -- claim of a message we move can be under way.
  PERFORM pg_advisory_xact_lock(1718384741, q.id);   -- 'flre': one redrive of a DLQ at a time
  PERFORM 1 FROM fluxpg.cursors c JOIN fluxpg.groups g ON g.id = c.group_id WHERE g.queue_id = q.id
     ORDER BY c.group_id, c.partition FOR UPDATE OF c;
  lo := greatest(coalesce(fluxpg._lo(offsets), from_offset, 0), fluxpg._live_floor(q, 0));
  hi := coalesce(fluxpg._hi(offsets) + 1, to_offset, 9223372036854775807);
  SELECT array_agg(m.seq ORDER BY m.seq), array_agg(m.target ORDER BY m.seq), array_agg(m.topic ORDER BY m.seq),
         array_agg(m.payload ORDER BY m.seq), array_agg(m.h ORDER BY m.seq),
         min(m.target_name) FILTER (WHERE m.target IS NULL)
    INTO s_arr, t_arr, topic_arr, p_arr, h_arr, missing
    FROM (SELECT l.seq, t.id AS target, tn.name AS target_name,
                 coalesce(l.headers ->> '_dlq_original_topic', '$queue/' || tn.name) AS topic, l.payload,
                 coalesce(l.headers, '{}') || jsonb_build_object(
                   '_redriven_from', q.name || ':' || l.seq, '_redriven_at', moved_at,
                   '_redrive_count', coalesce((l.headers ->> '_redrive_count')::int, 0) + 1) AS h
            FROM fluxpg.log l
            CROSS JOIN LATERAL (SELECT coalesce(l.headers ->> '_dlq_original_queue',
                                                CASE WHEN q.name LIKE '$dlq/%' THEN substr(q.name, 6) END) AS name) tn
            LEFT JOIN fluxpg.queues t ON t.name = tn.name
           WHERE l.queue_id = q.id AND l.partition = 0 AND l.seq >= lo AND l.seq < hi
             AND (offsets IS NULL OR l.seq = ANY (offsets))
             AND NOT EXISTS (SELECT 1 FROM fluxpg.redriven r WHERE r.queue_id = q.id AND r.partition = 0 AND r.seq = l.seq)
             AND NOT EXISTS (SELECT 1 FROM fluxpg.pending p JOIN fluxpg.groups g ON g.id = p.group_id
                              WHERE g.queue_id = q.id AND p.partition = 0 AND p.seq = l.seq)) m;
  n := coalesce(cardinality(s_arr), 0);
  IF n > 0 AND array_position(t_arr, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'FP001',
      MESSAGE = format('redrive: the original queue %L of a message in %L does not exist', coalesce(missing, '?'), q.name),
      HINT = 'declare the queue again, or give the offsets of the other messages';
  END IF;
  IF n = 0 OR dry_run THEN RETURN n; END IF;
  INSERT INTO fluxpg.redriven (queue_id, partition, seq, to_queue_id, to_partition, to_seq)
  SELECT q.id, 0, s_arr[a.ord], a.queue_id, a.partition, a.seq
    FROM fluxpg.append_batch(t_arr, topic_arr, p_arr, h_arr) a;
  RETURN n;
END $$;
COMMENT ON FUNCTION fluxpg.redrive(text, bigint[], bigint, bigint, boolean) IS 'Move dead letters (given offsets, an offset range, or all) back to their original queue as new messages, atomically; returns how many moved';

-- ---------------------------------------------------------------------------------------------
-- Delivery: classic claim and stream read share the cursor scan
-- ---------------------------------------------------------------------------------------------

-- Prepare delivering up to `want` new messages of one partition from the group's cursor: lock
-- the cursor row (so each batch goes to one consumer), commit-on-get for auto-commit stream
-- groups, apply the pending cap of classic groups. Returns the scan window [cur, window_end) and
-- how many to take (0: nothing to do). The caller's scan skips expired and filter-mismatched rows
-- and moves the cursor past what it scanned. The window never passes the head as this
-- transaction sees it, and rows below a committed head are all committed (the head and its rows
-- commit together), so no message is ever skipped.
CREATE OR REPLACE FUNCTION fluxpg._window(q fluxpg.queues, g fluxpg.groups, part int, want int,
                                          auto_commit_every interval,
                                          OUT cur bigint, OUT window_end bigint, OUT take int)
LANGUAGE plpgsql AS $$
DECLARE
  last_commit timestamptz;
  head bigint;
  max_pending int;
  lowest bigint;
  npending int;
BEGIN
  take := 0;
  SELECT c.cursor, c.last_commit_at INTO cur, last_commit
    FROM fluxpg.cursors c WHERE c.group_id = g.id AND c.partition = part FOR UPDATE;
  IF NOT FOUND THEN
    INSERT INTO fluxpg.cursors (group_id, partition, cursor, committed)
    SELECT g.id, part, h.first_seq, h.first_seq FROM fluxpg.heads h WHERE h.queue_id = q.id AND h.partition = part
    ON CONFLICT DO NOTHING;
    SELECT c.cursor, c.last_commit_at INTO cur, last_commit
      FROM fluxpg.cursors c WHERE c.group_id = g.id AND c.partition = part FOR UPDATE;
  END IF;
  IF auto_commit_every IS NOT NULL AND g.auto_commit
     AND (last_commit IS NULL OR last_commit <= now() - auto_commit_every) THEN
    UPDATE fluxpg.cursors SET committed = cur, last_commit_at = now()
     WHERE group_id = g.id AND partition = part AND committed <> cur;
  END IF;
  SELECT h.next_seq, greatest(cur, h.first_seq) INTO head, cur
    FROM fluxpg.heads h WHERE h.queue_id = q.id AND h.partition = part;
  IF cur >= head OR want <= 0 THEN RETURN; END IF;
  IF g.mode = 'classic' THEN
    max_pending := coalesce((q.settings #>> '{delivery,max_pending}')::int, 0);
    IF max_pending > 0 THEN
      SELECT min(p.seq) INTO lowest FROM fluxpg.pending p WHERE p.group_id = g.id AND p.partition = part;
      -- cur - lowest bounds the pending count from above; count exactly only near the cap.
      IF cur - coalesce(lowest, cur) + want > max_pending THEN
        SELECT count(*) INTO npending FROM fluxpg.pending p WHERE p.group_id = g.id;
        IF npending >= max_pending THEN RETURN; END IF;
        want := least(want, max_pending - npending);
      END IF;
    END IF;
  END IF;
  window_end := least(head, cur + greatest(want * 64, 4096));
  take := want;
END $$;

-- Take pending entries of a group for a consumer: those due for redelivery (mode 'due'), idle
-- longer than min_idle (mode 'idle', XAUTOCLAIM), or the consumer's own (mode 'own', a consumer
-- re-reading its pending entries after a crash). Entries whose message expired or that were
-- delivered 1 + max_retries times are dead-lettered instead; entries whose message is gone
-- (segment dropped) are removed.
-- Dead-letter due entries inside a claim. If that fails (the DLQ is full, or its message is too
-- large for it) the entries are parked — visible again after the visibility timeout, the reason
-- in pending.last_error (pending_entries) — and the claim goes on with the rest of the group: one
-- poison message must not make every claim raise.
CREATE OR REPLACE FUNCTION fluxpg._dead_letter_or_park(q fluxpg.queues, g fluxpg.groups, seqs bigint[], reason text,
                                                       vt interval) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  err text;
BEGIN
  BEGIN
    PERFORM fluxpg._dead_letter(q, g, 0, seqs, reason);
    RETURN;
  EXCEPTION WHEN OTHERS THEN  -- a subtransaction: only what _dead_letter did is undone
    GET STACKED DIAGNOSTICS err = MESSAGE_TEXT;
  END;
  UPDATE fluxpg.pending p SET visible_at = now() + greatest(vt, interval '1 second'),
                              last_error = format('dead-lettering (%s) failed: %s', reason, err)
   WHERE p.group_id = g.id AND p.partition = 0 AND p.seq BETWEEN fluxpg._lo(seqs) AND fluxpg._hi(seqs) AND p.seq = ANY (seqs);
  RAISE WARNING 'queue %, group %: % message(s) could not be dead-lettered and are parked: %', q.name, g.name,
    cardinality(seqs), err;
END $$;

-- Custom plans here (SET plan_cache_mode = auto, also when called from a function that runs with
-- generic ones): only a plan for the actual `mode` folds the CASE below, so that 'due' reads the
-- pending_due index from the due end; a generic plan reads and sorts every pending entry of the
-- group (EXPLAIN of both on a group with pending entries).
CREATE OR REPLACE FUNCTION fluxpg._take_pending(q fluxpg.queues, g fluxpg.groups, consumer text, n int,
                                                mode text, min_idle interval DEFAULT NULL, after bigint DEFAULT NULL,
                                                sel jsonpath DEFAULT NULL)
RETURNS SETOF fluxpg.delivery LANGUAGE plpgsql SET plan_cache_mode = auto AS $$
DECLARE
  r record;
  max_deliveries int := 1 + coalesce((q.settings #>> '{retry,max_retries}')::int, 10);
  vt interval := fluxpg._interval(q.settings #>> '{delivery,visibility_timeout}');
  take_p int[] := '{}';
  take_s bigint[] := '{}';
  gone_s bigint[] := '{}';
  expired_s bigint[] := '{}';
  over_s bigint[] := '{}';
BEGIN
  IF n <= 0 THEN RETURN; END IF;
  FOR r IN
    SELECT p.partition, p.seq, p.delivery_count, l.seq IS NULL AS gone,
           (l.expires_at IS NOT NULL AND l.expires_at <= now()) AS expired
      FROM fluxpg.pending p
      LEFT JOIN fluxpg.log l ON l.queue_id = q.id AND l.partition = p.partition AND l.seq = p.seq
     WHERE p.group_id = g.id
       AND CASE mode WHEN 'due' THEN p.visible_at <= now()
                     WHEN 'idle' THEN p.delivered_at <= now() - min_idle
                     ELSE p.consumer = _take_pending.consumer AND (after IS NULL OR p.seq > after) END
       AND (sel IS NULL OR (coalesce(l.headers, '{}') @@ sel) IS TRUE)
     ORDER BY CASE WHEN mode = 'due' THEN p.visible_at END, p.seq
     LIMIT n
       FOR UPDATE OF p SKIP LOCKED
  LOOP
    -- Classic queues have one partition (0), so the seq arrays below are per partition 0.
    IF r.gone THEN gone_s := gone_s || r.seq;
    ELSIF r.expired THEN expired_s := expired_s || r.seq;
    ELSIF r.delivery_count >= max_deliveries THEN over_s := over_s || r.seq;
    ELSE take_p := take_p || r.partition; take_s := take_s || r.seq;
    END IF;
  END LOOP;
  IF cardinality(gone_s) > 0 THEN
    DELETE FROM fluxpg.pending WHERE group_id = g.id AND partition = 0 AND seq BETWEEN fluxpg._lo(gone_s) AND fluxpg._hi(gone_s) AND seq = ANY (gone_s);
  END IF;
  IF cardinality(expired_s) > 0 THEN PERFORM fluxpg._dead_letter_or_park(q, g, expired_s, 'expired', vt); END IF;
  IF cardinality(over_s) > 0 THEN PERFORM fluxpg._dead_letter_or_park(q, g, over_s, 'max-deliveries', vt); END IF;
  IF cardinality(take_s) = 0 THEN RETURN; END IF;
  RETURN QUERY
  WITH upd AS (
    UPDATE fluxpg.pending p
       SET consumer = _take_pending.consumer, delivered_at = now(),
           delivery_count = p.delivery_count + 1, visible_at = now() + vt
      FROM unnest(take_p, take_s) AS t(part, seq)
     WHERE p.group_id = g.id AND p.partition = t.part AND p.seq = t.seq
    RETURNING p.partition, p.seq, p.delivery_count
  )
  SELECT q.name, g.name, upd.partition, upd.seq, l.topic, l.payload, l.headers, l.created_at,
         upd.delivery_count, q.name || ':' || upd.seq
    FROM upd JOIN fluxpg.log l ON l.queue_id = q.id AND l.partition = upd.partition AND l.seq = upd.seq
   ORDER BY upd.seq;
END $$;

-- A claim's or read's scan found no row at offset `gap` of a queue partition, below `upto` (where
-- its cursor would go). Offsets are dense — an append takes consecutive ones, and its rows commit
-- with the head that _window read before the scan — so the row exists unless
-- * retention dropped its segment and has not yet moved the partition's first offset up
--   (_forget_segment runs after the DROP): below the lowest segment left, nothing is coming back,
--   and the cursor may go up to it;
-- * the scan's plan does not include its segment: ATTACH PARTITION locks the log table of the
--   queue only in SHARE UPDATE EXCLUSIVE mode, which readers do not wait for, so a plan can be
--   built from a partition list older than the snapshot the scan then reads with. A backend
--   takes the invalidation that adds the segment only when it locks a relation it did not
--   hold yet in its transaction: a claim in a transaction that already read the log saw it
--   late, and a generic plan being built when it arrives is cached without the segment (the
--   invalidation names log_<queue>, which the cached query does not reference; it references
--   fluxpg.log) and stays so until the next invalidation of one of its relations.
-- In that case the cursor stops at the gap. Locking the gap's segment takes the pending
-- invalidations, and DISCARD PLANS drops this session's cached plans, so the claim's retry (the
-- `fluxpg.scan_gap` flag) and later claims plan with the segment. Returns where the cursor goes.
CREATE OR REPLACE FUNCTION fluxpg._past_gap(qid int, part int, gap bigint, upto bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  lowest bigint;
  seg regclass;
BEGIN
  PERFORM set_config('fluxpg.scan_gap', gap::text, true);
  SELECT min(sl.from_seq) INTO lowest FROM fluxpg._segment_list sl WHERE sl.queue_id = qid AND sl.partition = part;
  IF lowest > gap THEN
    RETURN least(lowest, upto);
  END IF;
  SELECT sl.segment INTO seg FROM fluxpg._segment_list sl
   WHERE sl.queue_id = qid AND sl.partition = part AND sl.from_seq <= gap AND gap < sl.to_seq;
  IF seg IS NOT NULL THEN
    BEGIN
      EXECUTE format('LOCK TABLE %s IN ACCESS SHARE MODE', seg);
    EXCEPTION WHEN undefined_table THEN   -- dropped meanwhile: the next claim sees the floor move
      NULL;
    END;
  END IF;
  DISCARD PLANS;
  RAISE LOG 'fluxpg: queue % partition %: the scan did not see offset % (segment %, attached after its plan was made); the cursor stops there',
    qid, part, gap, seg;
  RETURN gap;
END $$;

-- A consumer with a selector (a jsonpath predicate over headers: fluxpg/selectors.py compiles
-- JMS selectors to it) takes only the messages it selects. New messages it passes over become
-- pending entries of no consumer (consumer '', delivery count 0), due at once: the group's other
-- consumers take them first on their next claim, in offset order (a NOTIFY wakes them). The
-- cursor moves past both, so a selector never stalls the group, and each message still goes to
-- one consumer of the group. Work per claim is bounded (SELECTED_SCAN rows looked at).
CREATE OR REPLACE FUNCTION fluxpg._claim_selected(q fluxpg.queues, g fluxpg.groups, consumer text, cur bigint,
                                                  window_end bigint, take int, sel jsonpath, vt interval,
                                                  skip_redriven boolean, check_gaps boolean)
RETURNS SETOF fluxpg.delivery LANGUAGE plpgsql AS $$
DECLARE
  r record;
  hit_s bigint[] := '{}';
  left_s bigint[] := '{}';
  last bigint;
  expect bigint := cur;
  upto bigint;
  scanned int := 0;
  scan_limit int := greatest(take * 16, 1000);
BEGIN
  -- Every row of the window in offset order, also those the claim passes over (expired, another
  -- topic, redriven), so that a missing offset shows (see _past_gap).
  FOR r IN SELECT l.seq,
                  CASE WHEN (l.expires_at IS NULL OR l.expires_at > now())
                            AND (g.filter_regex IS NULL OR fluxpg.routing_key(l.topic) ~ g.filter_regex)
                            AND (NOT skip_redriven OR NOT fluxpg._is_redriven(q.id, 0, l.seq))
                       THEN (coalesce(l.headers, '{}') @@ sel) IS TRUE END AS hit
             FROM fluxpg.log l
            WHERE l.queue_id = q.id AND l.partition = 0 AND l.seq >= cur AND l.seq < window_end
            ORDER BY l.seq
            LIMIT scan_limit
  LOOP
    EXIT WHEN check_gaps AND r.seq <> expect;
    expect := r.seq + 1;
    scanned := scanned + 1;
    last := r.seq;
    IF r.hit THEN hit_s := hit_s || r.seq; ELSIF NOT r.hit THEN left_s := left_s || r.seq; END IF;
    EXIT WHEN cardinality(hit_s) >= take;
  END LOOP;
  upto := CASE WHEN cardinality(hit_s) >= take OR scanned >= scan_limit THEN last + 1 ELSE window_end END;
  IF check_gaps AND expect < upto THEN
    upto := fluxpg._past_gap(q.id, 0, expect, upto);
  END IF;
  UPDATE fluxpg.cursors c SET cursor = upto WHERE c.group_id = g.id AND c.partition = 0;
  IF cardinality(left_s) > 0 THEN
    INSERT INTO fluxpg.pending (group_id, partition, seq, consumer, delivered_at, delivery_count, visible_at)
    SELECT g.id, 0, x, '', now(), 0, now() FROM unnest(left_s) x;
    PERFORM pg_notify('fluxpg_log', q.id::text);
  END IF;
  IF cardinality(hit_s) = 0 THEN RETURN; END IF;
  INSERT INTO fluxpg.pending (group_id, partition, seq, consumer, delivered_at, delivery_count, visible_at)
  SELECT g.id, 0, x, consumer, now(), 1, now() + vt FROM unnest(hit_s) x;
  RETURN QUERY
  SELECT q.name, g.name, 0, l.seq, l.topic, l.payload, l.headers, l.created_at, 1, q.name || ':' || l.seq
    FROM fluxpg.log l
   WHERE l.queue_id = q.id AND l.partition = 0
     AND l.seq BETWEEN fluxpg._lo(hit_s) AND fluxpg._hi(hit_s) AND l.seq = ANY (hit_s)
   ORDER BY l.seq;
END $$;

-- The cursor never passes an offset the scan did not read (the `stop` step, _past_gap): a scan
-- whose plan is older than a segment attached meanwhile stops at that segment, and the claim
-- tries once more with fresh plans. That made generic plans safe: with them the full suite once
-- lost 37 of 3,000 messages (a generic plan made while the segment's invalidation arrived is
-- cached without it), and so did a claim in a transaction that had read the log already.
-- Plans are PostgreSQL's choice (plan_cache_mode auto), not forced generic: a generic plan of
-- the scan covers every partition of fluxpg.log, the segments of all queues, and locks and prunes
-- them all on each call. A one-message claim cost ~500 µs of backend CPU generic against ~1,000
-- custom in a database with few segments, where auto picks the generic plan itself, but
-- 1,800–2,600 generic against 750–1,050 auto (custom) with 4,600 (benchmarks/README.md).
CREATE OR REPLACE FUNCTION fluxpg.claim(queue text, grp text, consumer text, n int DEFAULT 1,
                                        selector jsonpath DEFAULT NULL)
RETURNS SETOF fluxpg.delivery LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue, 'classic', 'claim');
  g fluxpg.groups;
  got int := 0;
  k int;
  w record;
  first_cur bigint;
  vt interval;
  skip_redriven boolean;
  check_gaps boolean;
  retried boolean := false;
  dead bigint[];
BEGIN
  IF n IS NULL OR n < 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = format('claim: n must be at least 1, got %s', n);
  END IF;
  g := fluxpg._group(q, grp);
  PERFORM fluxpg._ensure_member(g.id, consumer);
  -- Redeliveries first (visibility timeout or nack backoff passed), to any consumer. The
  -- EXISTS probe spares the call when nothing is due (the common case).
  IF EXISTS (SELECT 1 FROM fluxpg.pending p WHERE p.group_id = g.id AND p.visible_at <= now()) THEN
    RETURN QUERY SELECT * FROM fluxpg._take_pending(q, g, consumer, n, 'due', NULL, NULL, selector);
    GET DIAGNOSTICS got = ROW_COUNT;
  END IF;
  IF got >= n THEN
    PERFORM fluxpg._touch_member(g.id, consumer);
    RETURN;
  END IF;
  w := fluxpg._window(q, g, 0, n - got, NULL);
  IF w.take = 0 THEN
    PERFORM fluxpg._touch_member(g.id, consumer);   -- after the cursor row (lock order)
    RETURN;
  END IF;
  first_cur := w.cur;
  vt := fluxpg._interval(q.settings #>> '{delivery,visibility_timeout}');
  -- A dead-letter queue some of whose messages were redriven: those left it (fluxpg.redrive).
  skip_redriven := fluxpg._has_redriven(q.id);
  -- Transient queues have no segments, and their rows are deleted (ack, sweep): holes are normal.
  check_gaps := q.durability <> 'transient';
  LOOP
    IF selector IS NOT NULL THEN
      RETURN QUERY SELECT * FROM fluxpg._claim_selected(q, g, consumer, w.cur, w.window_end, w.take, selector, vt,
                                                        skip_redriven, check_gaps);
    ELSE
    -- The scan is written out here (and in read) rather than in a shared set-returning function:
    -- nesting one copies every row once more (measured: a quarter of a 500-message claim).
    -- It reads every row of the window in offset order, also those the claim passes over
    -- (expired, another topic, redriven: `ok` false; their payloads are not carried along),
    -- until the take-th deliverable one (the window's run condition on `nok` stops the scan
    -- there). The cursor goes past the last message taken when the batch is full, else to the
    -- window's end — but never past an offset the scan did not read (`seen`, see _past_gap),
    -- and only what lies below the cursor is delivered.
    RETURN QUERY
    WITH el AS (
      SELECT x.seq, x.topic, x.payload, x.headers, x.created_at, x.ok, x.nok, x.rn
        FROM (SELECT r.seq, r.ok, CASE WHEN r.ok THEN r.topic END AS topic, CASE WHEN r.ok THEN r.payload END AS payload,
                     CASE WHEN r.ok THEN r.headers END AS headers, r.created_at,
                     count(*) FILTER (WHERE r.ok) OVER o AS nok, row_number() OVER o AS rn
                FROM (SELECT l.seq, l.topic, l.payload, l.headers, l.created_at,
                             (l.expires_at IS NULL OR l.expires_at > now())
                             AND (g.filter_regex IS NULL OR fluxpg.routing_key(l.topic) ~ g.filter_regex)
                             AND (NOT skip_redriven OR NOT fluxpg._is_redriven(q.id, 0, l.seq)) AS ok
                        FROM fluxpg.log l
                       WHERE l.queue_id = q.id AND l.partition = 0 AND l.seq >= w.cur AND l.seq < w.window_end
                       ORDER BY l.seq OFFSET 0) r
              WINDOW o AS (ORDER BY r.seq ROWS UNBOUNDED PRECEDING)) x
       WHERE x.nok <= w.take
    ), seen AS (
      SELECT CASE WHEN count(*) FILTER (WHERE el.ok) >= w.take THEN max(el.seq) FILTER (WHERE el.ok) + 1
                  ELSE w.window_end END AS upto,
             coalesce(min(w.cur + el.rn - 1) FILTER (WHERE el.seq <> w.cur + el.rn - 1), w.cur + count(*)) AS upto_read
        FROM el
    ), stop AS (
      SELECT CASE WHEN seen.upto_read >= seen.upto OR NOT check_gaps THEN seen.upto
                  ELSE fluxpg._past_gap(q.id, 0, seen.upto_read, seen.upto) END AS c
        FROM seen
    ), ins AS (
      INSERT INTO fluxpg.pending (group_id, partition, seq, consumer, delivered_at, delivery_count, visible_at)
      SELECT g.id, 0, el.seq, consumer, now(), 1, now() + vt FROM el WHERE el.ok AND el.seq < (SELECT stop.c FROM stop)
    ), mv AS (
      UPDATE fluxpg.cursors c SET cursor = (SELECT stop.c FROM stop)
       WHERE c.group_id = g.id AND c.partition = 0
    )
    SELECT q.name, g.name, 0, el.seq, el.topic, el.payload, el.headers, el.created_at, 1, q.name || ':' || el.seq
      FROM el WHERE el.ok AND el.seq < (SELECT stop.c FROM stop) ORDER BY el.seq;
    END IF;
    GET DIAGNOSTICS k = ROW_COUNT;
    got := got + k;
    -- The scan stopped at a gap (_past_gap set the flag): once more, with fresh plans.
    EXIT WHEN got >= n OR retried OR coalesce(current_setting('fluxpg.scan_gap', true), '') = '';
    PERFORM set_config('fluxpg.scan_gap', '', true);
    retried := true;
    w := fluxpg._window(q, g, 0, n - got, NULL);
    EXIT WHEN w.take = 0;
  END LOOP;
  IF coalesce((q.settings #>> '{dlq,expired}')::boolean, false) THEN
    -- dlq.expired (AMQP x-dead-letter-exchange): what the scan passed over because it expired is
    -- dead-lettered, not skipped silently (RabbitMQ: expired messages reaching the head).
    SELECT array_agg(l.seq ORDER BY l.seq) INTO dead FROM fluxpg.log l
     WHERE l.queue_id = q.id AND l.partition = 0 AND l.seq >= first_cur
       AND l.seq < (SELECT c.cursor FROM fluxpg.cursors c WHERE c.group_id = g.id AND c.partition = 0)
       AND l.expires_at <= now()
       AND (g.filter_regex IS NULL OR fluxpg.routing_key(l.topic) ~ g.filter_regex);
    IF dead IS NOT NULL THEN
      PERFORM fluxpg._dead_letter(q, g, 0, dead, 'expired');
    END IF;
  END IF;
  PERFORM fluxpg._touch_member(g.id, consumer);
END $$;
COMMENT ON FUNCTION fluxpg.claim(text, text, text, int, jsonpath) IS 'Classic queues: up to n messages for a consumer, redeliveries first, then new ones from the group cursor; with a selector (jsonpath over headers) only the messages it selects, the others left due for the group''s other consumers';

-- The claims of fluxpg.append_claim and fluxpg.sequence_claim, after their appends in the same
-- transaction: target i is (c_queues[i], c_groups[i], c_consumers[i], at most c_n[i] messages);
-- a target of a queue not in `appended` (when given: the queues just appended to) is not claimed for.
-- A target is skipped, left to its own claim after the wake-up, rather than waited for (see
-- append_claim). Rows: target i and the claimed message.
--
-- Direct handoff (b_* given: the batch append_claim just appended, one entry per appended row:
-- queue id, offset, topic, payload, headers): when the target group's cursor stands exactly at
-- the first offset this batch appended to the queue, the claim's window is this batch's rows of
-- the queue and nothing else (offsets are dense, and this transaction holds the queue's head
-- lock, so no one else appended behind them). Then the claim is written from those rows without
-- reading the log back: the pending rows, the cursor, the member's heartbeat, exactly what
-- fluxpg.claim would write for them. It is taken only where fluxpg.claim could not do anything
-- else: a classic queue of one partition, a group without a topic filter, delivery.max_pending
-- not near (checked as _window does), no overflow drop-head, not a DLQ with redriven messages, and no row carrying its own expiration
-- (x-amqp-expiration: it may be expired already). Otherwise fluxpg.claim runs as before. The
-- saving is the claim's own statements, most of all planning its scan over the partitioned log
-- (a custom plan per call): about half of append_claim's backend CPU for one message.
CREATE OR REPLACE FUNCTION fluxpg._handoff_claims(c_queues text[], c_groups text[], c_consumers text[], c_n int[],
                                                  appended int[] DEFAULT NULL,
                                                  b_queue_ids int[] DEFAULT NULL, b_seqs bigint[] DEFAULT NULL,
                                                  b_topics text[] DEFAULT NULL, b_payloads bytea[] DEFAULT NULL,
                                                  b_headers jsonb[] DEFAULT NULL,
                                                  c_ack_targets int[] DEFAULT NULL, c_ack_seqs bigint[] DEFAULT NULL)
RETURNS TABLE (r_target int, r_queue_id int, r_partition int, r_seq bigint, r_topic text,
               r_payload bytea, r_headers jsonb, r_created_at timestamptz, r_delivery_count int)
LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues;
  g fluxpg.groups;
  cur bigint;
  lo bigint;
  cnt int;
  m int;
  max_pending int;
  lowest bigint;
  expiring boolean;
  acks bigint[];
  due boolean;
  known boolean;
  t record;
BEGIN
  FOR i IN 1 .. coalesce(cardinality(c_queues), 0) LOOP
    -- One statement for what the target needs to know before it locks anything: its queue and
    -- group, whether redeliveries are due, whether its member row exists (each a statement of its
    -- own before: an executor start-up apiece on every round of the appender and the sequencer).
    SELECT qq AS q, gg AS g,
           EXISTS (SELECT 1 FROM fluxpg.pending p WHERE p.group_id = gg.id AND p.visible_at <= now()) AS due,
           EXISTS (SELECT 1 FROM fluxpg.members mb WHERE mb.group_id = gg.id AND mb.name = c_consumers[i]) AS known
      INTO t
      FROM fluxpg.queues qq JOIN fluxpg.groups gg ON gg.queue_id = qq.id AND gg.name = c_groups[i]
     WHERE qq.name = c_queues[i] AND qq.kind = 'classic';
    CONTINUE WHEN NOT FOUND;
    q := t.q; g := t.g; due := t.due; known := t.known;   -- assignments: no executor start-up
    IF c_ack_targets IS NOT NULL AND i = ANY (c_ack_targets) THEN
      -- The target's carried acks (fluxpg.ack of a classic queue, partition 0), before its claim
      -- and before the member and cursor rows, the lock order of fluxpg.ack_claim. A queue or
      -- group that is gone has nothing pending to ack.
      -- Through fluxpg.ack, as ack_claim: the one place an acknowledgement's rule lives.
      acks := ARRAY(SELECT u.s FROM unnest(c_ack_targets, c_ack_seqs) AS u(at, s) WHERE u.at = i);
      PERFORM fluxpg.ack(q.name, g.name, acks, 0);
      due := EXISTS (SELECT 1 FROM fluxpg.pending p WHERE p.group_id = g.id AND p.visible_at <= now());
    END IF;
    CONTINUE WHEN coalesce((q.settings #>> '{dlq,expired}')::boolean, false);
    CONTINUE WHEN appended IS NOT NULL AND NOT (q.id = ANY (appended));
    CONTINUE WHEN due;
    IF NOT known THEN
      PERFORM fluxpg._ensure_member(g.id, c_consumers[i]);
    END IF;
    SELECT c.cursor INTO cur FROM fluxpg.cursors c WHERE c.group_id = g.id AND c.partition = 0 FOR UPDATE SKIP LOCKED;
    CONTINUE WHEN NOT FOUND;
    IF b_seqs IS NOT NULL AND c_n[i] >= 1 AND q.partitions = 1 AND g.filter_regex IS NULL
       AND coalesce(q.settings #>> '{limits,overflow}', '') <> 'drop-head' THEN
      SELECT min(u.s), count(*), coalesce(bool_or(u.h ? 'x-amqp-expiration'), false) INTO lo, cnt, expiring
        FROM unnest(b_queue_ids, b_seqs, b_headers) AS u(qid, s, h) WHERE u.qid = q.id;
      max_pending := coalesce((q.settings #>> '{delivery,max_pending}')::int, 0);
      IF max_pending > 0 AND cnt > 0 AND cur = lo THEN
        -- As _window: cur - (lowest pending offset) bounds the group's pending count from above;
        -- near the cap fluxpg.claim counts exactly (and may take fewer).
        SELECT min(p.seq) INTO lowest FROM fluxpg.pending p WHERE p.group_id = g.id AND p.partition = 0;
        max_pending := CASE WHEN cur - coalesce(lowest, cur) + c_n[i] > max_pending THEN -1 ELSE 0 END;
      END IF;
      IF cnt > 0 AND cur = lo AND max_pending >= 0 AND NOT expiring AND NOT fluxpg._has_redriven(q.id) THEN
        m := least(cnt, c_n[i]);
        RETURN QUERY
        WITH ins AS (
          INSERT INTO fluxpg.pending (group_id, partition, seq, consumer, delivered_at, delivery_count, visible_at)
          SELECT g.id, 0, u.s, c_consumers[i], now(), 1,
                 now() + fluxpg._interval(q.settings #>> '{delivery,visibility_timeout}')
            FROM unnest(b_queue_ids, b_seqs) AS u(qid, s)
           WHERE u.qid = q.id AND u.s < lo + m
        ), mv AS (
          UPDATE fluxpg.cursors c SET cursor = lo + m WHERE c.group_id = g.id AND c.partition = 0
        )
        SELECT i, q.id, 0, u.s, u.t, u.pl, u.h, now(), 1
          FROM unnest(b_queue_ids, b_seqs, b_topics, b_payloads, b_headers) AS u(qid, s, t, pl, h)
         WHERE u.qid = q.id AND u.s < lo + m
         ORDER BY u.s;
        PERFORM fluxpg._touch_member(g.id, c_consumers[i]);   -- after the cursor row (lock order)
        CONTINUE;
      END IF;
    END IF;
    RETURN QUERY SELECT i, q.id, d.partition, d.seq, d.topic, d.payload, d.headers, d.created_at, d.delivery_count
                   FROM fluxpg.claim(c_queues[i], c_groups[i], c_consumers[i], c_n[i]) d;
  END LOOP;
END $$;

-- Append a batch (fluxpg.append_batch) and, in the same transaction, claim for consumers of the
-- calling broker node that wait for new messages (target i: c_queues[i], c_groups[i],
-- c_consumers[i], up to c_n[i] messages, as fluxpg.claim). One commit then covers the publish
-- and its delivery: the pending rows are written before anything is delivered, confirms and
-- deliveries both follow the commit, and the consumer is spared the NOTIFY → claim round trip
-- (and its transaction). A target is skipped, left to its own claim after the wake-up, rather
-- than waited for: when its cursor row is locked (another consumer is claiming), when
-- redeliveries are due (they go first and may dead-letter, which appends to another queue while
-- this transaction holds heads), or when the queue dead-letters expired messages (same reason).
-- So the append never waits on a lock a consumer holds. The member row is ensured before the
-- cursor row is locked (the lock order above _ensure_member).
-- Rows: the appended ones (target 0; ord, queue id, partition, seq as append_batch returns them),
-- then the claimed ones (target i; seq and the message).
-- notify_tag: as fluxpg.append_batch's (NULL: untagged), from the caller as fluxpg.sequence_claim's:
-- `,@<node>` only when the caller wakes this node's consumers of the batch's queues itself.
--
-- Acks ride along (c_ack_targets / c_ack_seqs, parallel: offset c_ack_seqs[j] of target
-- c_ack_targets[j]'s queue and group, partition 0): the acknowledgements a target's channel has
-- not written yet, applied (as fluxpg.ack) before its claim, as fluxpg.ack_claim does, so that a
-- consumer taking one message at a time needs no ack transaction of its own (_handoff_claims).
CREATE OR REPLACE FUNCTION fluxpg.append_claim(queue_ids int[], topics text[], payloads bytea[], headers jsonb[],
                                               keys text[], c_queues text[], c_groups text[], c_consumers text[],
                                               c_n int[], c_ack_targets int[] DEFAULT NULL,
                                               c_ack_seqs bigint[] DEFAULT NULL, notify_tag text DEFAULT NULL)
RETURNS TABLE (r_target int, r_ord int, r_queue_id int, r_partition int, r_seq bigint, r_topic text,
               r_payload bytea, r_headers jsonb, r_created_at timestamptz, r_delivery_count int)
LANGUAGE plpgsql AS $$
DECLARE
  a_ord int[];
  a_q int[];
  a_p int[];
  a_s bigint[];
BEGIN
  -- append_batch returns its rows in ordinal order, one per input row (a_* [i] is input row i).
  SELECT array_agg(a.ord ORDER BY a.ord), array_agg(a.queue_id ORDER BY a.ord),
         array_agg(a.partition ORDER BY a.ord), array_agg(a.seq ORDER BY a.ord)
    INTO a_ord, a_q, a_p, a_s
    FROM fluxpg.append_batch(queue_ids, topics, payloads, headers, keys, notify_tag) a;
  RETURN QUERY SELECT 0, u.o, u.q, u.p, u.s, NULL::text, NULL::bytea, NULL::jsonb, NULL::timestamptz, NULL::int
                 FROM unnest(a_ord, a_q, a_p, a_s) AS u(o, q, p, s);
  RETURN QUERY SELECT h.r_target, NULL::int, h.r_queue_id, h.r_partition, h.r_seq, h.r_topic, h.r_payload,
                      h.r_headers, h.r_created_at, h.r_delivery_count
                 FROM fluxpg._handoff_claims(c_queues, c_groups, c_consumers, c_n, NULL, a_q, a_s,
                                             topics, payloads, headers, c_ack_targets, c_ack_seqs) h;
END $$;
COMMENT ON FUNCTION fluxpg.append_claim(int[], text[], bytea[], jsonb[], text[], text[], text[], text[], int[], int[], bigint[], text) IS 'append_batch plus, in the same transaction, the acks the calling node''s waiting consumers have not written yet and claims for them (used by the broker; a target whose cursor is busy or that has redeliveries due is skipped); notify_tag as fluxpg.append_batch''s';

CREATE OR REPLACE FUNCTION fluxpg.reclaim(queue text, grp text, consumer text, n int DEFAULT 100,
                                          after bigint DEFAULT NULL)
RETURNS SETOF fluxpg.delivery LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue, 'classic', 'reclaim');
  g fluxpg.groups := fluxpg._group(q, grp, false);
BEGIN
  IF n IS NULL OR n < 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = format('reclaim: n must be at least 1, got %s', n);
  END IF;
  PERFORM fluxpg._touch_member(g.id, consumer);
  RETURN QUERY SELECT * FROM fluxpg._take_pending(q, g, consumer, n, 'own', NULL, after);
END $$;
COMMENT ON FUNCTION fluxpg.reclaim(text, text, text, int, bigint) IS 'A consumer re-reads its own pending entries in offset order, those after offset `after` when given (XREADGROUP with an id: 0 or the last one seen), e.g. after a crash; page with after = the last offset returned';

CREATE OR REPLACE FUNCTION fluxpg.claim_stale(queue text, grp text, consumer text, min_idle interval, n int DEFAULT 10)
RETURNS SETOF fluxpg.delivery LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue, 'classic', 'claim_stale');
  g fluxpg.groups := fluxpg._group(q, grp, false);
BEGIN
  IF min_idle IS NULL OR min_idle < interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = 'claim_stale: min_idle must be a non-negative interval';
  END IF;
  PERFORM fluxpg._touch_member(g.id, consumer);
  RETURN QUERY SELECT * FROM fluxpg._take_pending(q, g, consumer, n, 'idle', min_idle);
END $$;
COMMENT ON FUNCTION fluxpg.claim_stale(text, text, text, interval, int) IS 'XAUTOCLAIM: take over pending entries idle for at least min_idle';

-- Queues with dlq.expired (AMQP x-dead-letter-exchange): messages that expired at the front of a
-- group — nobody consumes, or the consumer is slow — are dead-lettered now rather than when a
-- claim reaches them (aio-pika's RPC relies on an expired request being dead-lettered). Only the
-- expired run at each group's cursor moves (claims handle what lies behind live messages). A
-- queue without groups gets its default group (the queue's name, as AMQP consumers use) first.
-- Cursor rows are taken SKIP LOCKED: nodes running this at once, or a claim, never collide.
-- Returns how many messages were dead-lettered.
CREATE OR REPLACE FUNCTION fluxpg.dead_letter_expired() RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues;
  g fluxpg.groups;
  c record;
  head bigint;
  boundary bigint;
  dead bigint[];
  k int := 0;
BEGIN
  FOR q IN SELECT * FROM fluxpg.queues
            WHERE kind = 'classic' AND coalesce((settings #>> '{dlq,expired}')::boolean, false) LOOP
    IF NOT EXISTS (SELECT 1 FROM fluxpg.groups WHERE queue_id = q.id) THEN
      PERFORM fluxpg._group(q, q.name);
    END IF;
    SELECT h.next_seq INTO head FROM fluxpg.heads h WHERE h.queue_id = q.id AND h.partition = 0;
    FOR c IN SELECT cu.group_id, cu.cursor FROM fluxpg.cursors cu JOIN fluxpg.groups gg ON gg.id = cu.group_id
              WHERE gg.queue_id = q.id AND cu.partition = 0
                FOR UPDATE OF cu SKIP LOCKED LOOP
      SELECT l.seq INTO boundary FROM fluxpg.log l
       WHERE l.queue_id = q.id AND l.partition = 0 AND l.seq >= c.cursor AND l.seq < head
         AND (l.expires_at IS NULL OR l.expires_at > now())
       ORDER BY l.seq LIMIT 1;
      boundary := coalesce(boundary, head);
      CONTINUE WHEN boundary <= c.cursor;
      SELECT * INTO g FROM fluxpg.groups WHERE id = c.group_id;
      SELECT array_agg(l.seq ORDER BY l.seq) INTO dead FROM fluxpg.log l
       WHERE l.queue_id = q.id AND l.partition = 0 AND l.seq >= c.cursor AND l.seq < boundary
         AND (g.filter_regex IS NULL OR fluxpg.routing_key(l.topic) ~ g.filter_regex);
      UPDATE fluxpg.cursors SET cursor = boundary WHERE group_id = c.group_id AND partition = 0;
      IF dead IS NOT NULL THEN
        PERFORM fluxpg._dead_letter(q, g, 0, dead, 'expired');
        k := k + cardinality(dead);
      END IF;
    END LOOP;
  END LOOP;
  RETURN k;
END $$;
COMMENT ON FUNCTION fluxpg.dead_letter_expired() IS 'Dead-letter messages expired at the front of groups of queues with dlq.expired; returns how many';

-- Partition assignment of a partitioned stream group (OCI Streaming semantics), run by a member
-- each time it reads or heart-beats: members silent for delivery.member_timeout leave; the live
-- members, ordered by name, share the partitions round robin ((partitions / members) ± 1 each;
-- members beyond the partition count stay idle). A member hands over a partition it should no
-- longer have by releasing it (auto-commit groups checkpoint it first: commit-on-get); a member
-- takes a partition only when it is free or its owner left, and then starts at the checkpoint.
-- Ownership changes under the cursor row lock, so a partition never has two owners at once.
-- Returns the partitions this member owns (and holds locked) now.
CREATE OR REPLACE FUNCTION fluxpg._rebalance(q fluxpg.queues, g fluxpg.groups, consumer text) RETURNS int[]
LANGUAGE plpgsql AS $$
DECLARE
  timeout interval := fluxpg._interval(coalesce(q.settings #>> '{delivery,member_timeout}', '30s'));
  joined boolean;
  live text[];
  m int;
  c record;
  owned int[] := '{}';
  desired text;
BEGIN
  IF consumer IS NULL OR consumer = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = 'consumer name must not be empty';
  END IF;
  INSERT INTO fluxpg.members AS mb (group_id, name, node_id, last_seen_at)
  VALUES (g.id, consumer, nullif(current_setting('fluxpg.node_id', true), '')::int, now())
  ON CONFLICT (group_id, name) DO UPDATE SET last_seen_at = now(), node_id = EXCLUDED.node_id
  RETURNING (xmax = 0) INTO joined;
  PERFORM fluxpg._stamp_group(g.id);
  -- Members silent too long leave; one whose row is locked (a cascade deleting it, another
  -- member removing it) is passed over rather than waited for while this member's row is held.
  DELETE FROM fluxpg.members WHERE (group_id, name) IN (
    SELECT mb.group_id, mb.name FROM fluxpg.members mb
     WHERE mb.group_id = g.id AND mb.last_seen_at < now() - timeout FOR UPDATE SKIP LOCKED);
  SELECT array_agg(name ORDER BY name) INTO live FROM fluxpg.members WHERE group_id = g.id;
  m := cardinality(live);
  IF joined THEN
    PERFORM pg_notify('fluxpg_log', q.id::text);   -- the others rebalance on their next read
  END IF;
  -- Look without locks first; lock (skipping rows a reading member holds) only what changes hands
  -- or is ours.
  FOR c IN SELECT cu.partition, cu.owner FROM fluxpg.cursors cu WHERE cu.group_id = g.id ORDER BY cu.partition LOOP
    desired := live[(c.partition % m) + 1];
    IF c.owner = consumer OR (desired = consumer AND (c.owner IS NULL OR NOT (c.owner = ANY (live)))) THEN
      PERFORM 1 FROM fluxpg.cursors cu WHERE cu.group_id = g.id AND cu.partition = c.partition
                                          AND cu.owner IS NOT DISTINCT FROM c.owner
         FOR UPDATE SKIP LOCKED;
      CONTINUE WHEN NOT FOUND;       -- being read right now, or it changed hands meanwhile
      IF c.owner = consumer AND desired <> consumer THEN
        UPDATE fluxpg.cursors SET owner = NULL, owner_seen_at = NULL,
                                  committed = CASE WHEN g.auto_commit THEN cursor ELSE committed END,
                                  last_commit_at = CASE WHEN g.auto_commit THEN now() ELSE last_commit_at END
         WHERE group_id = g.id AND partition = c.partition;
      ELSIF c.owner = consumer THEN
        owned := owned || c.partition;
      ELSE
        UPDATE fluxpg.cursors SET owner = consumer, owner_seen_at = now(), cursor = committed
         WHERE group_id = g.id AND partition = c.partition;
        owned := owned || c.partition;
      END IF;
    END IF;
  END LOOP;
  RETURN owned;
END $$;

CREATE OR REPLACE FUNCTION fluxpg.read(queue text, grp text, consumer text, n int DEFAULT 1)
RETURNS SETOF fluxpg.delivery LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue, 'stream', 'read');
  g fluxpg.groups;
  every interval;
  got int := 0;
  k int;
  parts int[];
  start int;
  part int;
  w record;
BEGIN
  IF n IS NULL OR n < 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = format('read: n must be at least 1, got %s', n);
  END IF;
  g := fluxpg._group(q, grp);
  IF q.partitions > 1 THEN
    -- Partitioned: this member's share of the partitions; commit-on-get (OCI's default).
    parts := fluxpg._rebalance(q, g, consumer);
    every := interval '0';
  ELSE
    -- One partition: every member reads it, one batch at a time (the cursor row lock); the
    -- member row is stamped after the cursor row (lock order, see _touch_member).
    PERFORM fluxpg._ensure_member(g.id, consumer);
    parts := ARRAY[0];
    every := fluxpg._interval(q.settings #>> '{delivery,auto_commit_interval}');
  END IF;
  IF cardinality(parts) = 0 THEN RETURN; END IF;
  start := floor(random() * cardinality(parts))::int;
  FOR i IN 0 .. cardinality(parts) - 1 LOOP
    EXIT WHEN got >= n;
    part := parts[(start + i) % cardinality(parts) + 1];
    w := fluxpg._window(q, g, part, n - got, every);
    CONTINUE WHEN w.take = 0;
    -- As in claim: every row of the window in offset order until the take-th deliverable one,
    -- and the cursor never passes an offset the scan did not read (_past_gap).
    RETURN QUERY
    WITH el AS (
      SELECT x.seq, x.topic, x.payload, x.headers, x.created_at, x.ok, x.nok, x.rn
        FROM (SELECT r.seq, r.ok, CASE WHEN r.ok THEN r.topic END AS topic, CASE WHEN r.ok THEN r.payload END AS payload,
                     CASE WHEN r.ok THEN r.headers END AS headers, r.created_at,
                     count(*) FILTER (WHERE r.ok) OVER o AS nok, row_number() OVER o AS rn
                FROM (SELECT l.seq, l.topic, l.payload, l.headers, l.created_at,
                             (l.expires_at IS NULL OR l.expires_at > now())
                             AND (g.filter_regex IS NULL OR fluxpg.routing_key(l.topic) ~ g.filter_regex) AS ok
                        FROM fluxpg.log l
                       WHERE l.queue_id = q.id AND l.partition = part AND l.seq >= w.cur AND l.seq < w.window_end
                       ORDER BY l.seq OFFSET 0) r
              WINDOW o AS (ORDER BY r.seq ROWS UNBOUNDED PRECEDING)) x
       WHERE x.nok <= w.take
    ), seen AS (
      SELECT CASE WHEN count(*) FILTER (WHERE el.ok) >= w.take THEN max(el.seq) FILTER (WHERE el.ok) + 1
                  ELSE w.window_end END AS upto,
             coalesce(min(w.cur + el.rn - 1) FILTER (WHERE el.seq <> w.cur + el.rn - 1), w.cur + count(*)) AS upto_read
        FROM el
    ), stop AS (
      SELECT CASE WHEN seen.upto_read >= seen.upto THEN seen.upto
                  ELSE fluxpg._past_gap(q.id, part, seen.upto_read, seen.upto) END AS c
        FROM seen
    ), mv AS (
      UPDATE fluxpg.cursors c SET cursor = (SELECT stop.c FROM stop)
       WHERE c.group_id = g.id AND c.partition = part
    )
    SELECT q.name, g.name, part, el.seq, el.topic, el.payload, el.headers, el.created_at, 1, q.name || ':' || el.seq
      FROM el WHERE el.ok AND el.seq < (SELECT stop.c FROM stop) ORDER BY el.seq;
    GET DIAGNOSTICS k = ROW_COUNT;
    got := got + k;
  END LOOP;
  IF q.partitions = 1 THEN
    PERFORM fluxpg._touch_member(g.id, consumer);
  END IF;
END $$;
COMMENT ON FUNCTION fluxpg.read(text, text, text, int) IS 'Stream queues: up to n messages from the group cursor; no pending entries; auto-commit groups commit what earlier reads delivered (partitioned streams: this member''s partitions, commit-on-get)';

CREATE OR REPLACE FUNCTION fluxpg.heartbeat(queue text, grp text, consumer text) RETURNS int[]
LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue, 'stream', 'heartbeat');
  g fluxpg.groups := fluxpg._group(q, grp);
BEGIN
  IF q.partitions = 1 THEN
    PERFORM fluxpg._touch_member(g.id, consumer);
    RETURN ARRAY[0];
  END IF;
  RETURN fluxpg._rebalance(q, g, consumer);
END $$;
COMMENT ON FUNCTION fluxpg.heartbeat(text, text, text) IS 'A stream group member that is alive but not reading keeps its partitions; returns the partitions it owns';

-- A member leaves its group: its partitions are released (checkpointed for auto-commit groups)
-- and the others take them on their next read.
CREATE OR REPLACE FUNCTION fluxpg.leave(queue text, grp text, consumer text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue);
  g fluxpg.groups;
BEGIN
  SELECT * INTO g FROM fluxpg.groups WHERE queue_id = q.id AND name = grp;
  IF NOT FOUND THEN RETURN; END IF;
  UPDATE fluxpg.cursors SET owner = NULL, owner_seen_at = NULL,
                            committed = CASE WHEN g.auto_commit AND g.mode = 'stream' THEN cursor ELSE committed END
   WHERE group_id = g.id AND owner = consumer;
  DELETE FROM fluxpg.members WHERE group_id = g.id AND name = consumer;
  PERFORM pg_notify('fluxpg_log', q.id::text);
END $$;

-- Join a stream group: creates it when new and, only then, applies the start position
-- (OCI: TRIM_HORIZON/first, AT_TIME/timestamp=N, LATEST/last; ignored for an existing group).
-- Returns true when the group was created.
CREATE OR REPLACE FUNCTION fluxpg.join_group(queue text, grp text, start_position text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue, 'stream', 'join_group');
  existed boolean := EXISTS (SELECT 1 FROM fluxpg.groups WHERE queue_id = q.id AND name = grp);
BEGIN
  PERFORM fluxpg._group(q, grp);
  IF NOT existed AND start_position IS NOT NULL THEN
    PERFORM fluxpg.seek(queue, grp, start_position);
  END IF;
  RETURN NOT existed;
END $$;

-- Stream groups nobody used for the queue's retention period (retention.max_age) expire.
CREATE OR REPLACE FUNCTION fluxpg.expire_groups() RETURNS int
LANGUAGE plpgsql AS $$
DECLARE k int;
BEGIN
  DELETE FROM fluxpg.groups g USING fluxpg.queues q
   WHERE q.id = g.queue_id AND q.kind = 'stream'
     AND fluxpg._interval(q.settings #>> '{retention,max_age}') > interval '0'
     AND g.last_active_at < now() - fluxpg._interval(q.settings #>> '{retention,max_age}')
     AND NOT EXISTS (SELECT 1 FROM fluxpg.members m WHERE m.group_id = g.id
                      AND m.last_seen_at >= now() - fluxpg._interval(q.settings #>> '{retention,max_age}'));
  GET DIAGNOSTICS k = ROW_COUNT;
  RETURN k;
END $$;
COMMENT ON FUNCTION fluxpg.expire_groups() IS 'Delete stream groups unused for longer than their queue''s retention.max_age; returns how many';

-- ---------------------------------------------------------------------------------------------
-- Acknowledgement
-- ---------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION fluxpg.ack(queue text, grp text, seqs bigint[], part int DEFAULT 0)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue);
  g fluxpg.groups := fluxpg._group(q, grp, false);
  acked bigint[];
  k int;
BEGIN
  IF seqs IS NULL OR cardinality(seqs) = 0 THEN RETURN 0; END IF;
  IF q.kind = 'classic' AND q.durability = 'transient' THEN
    -- Transient: the acknowledged messages leave log_transient now (see _transient_forget).
    WITH d AS (
      DELETE FROM fluxpg.pending WHERE group_id = g.id AND partition = part AND seq BETWEEN fluxpg._lo(seqs) AND fluxpg._hi(seqs) AND seq = ANY (seqs)
      RETURNING seq
    )
    SELECT array_agg(d.seq) INTO acked FROM d;
    PERFORM fluxpg._transient_forget(q, g, part, acked);
    RETURN coalesce(cardinality(acked), 0);
  END IF;
  IF q.kind = 'classic' THEN
    DELETE FROM fluxpg.pending WHERE group_id = g.id AND partition = part AND seq BETWEEN fluxpg._lo(seqs) AND fluxpg._hi(seqs) AND seq = ANY (seqs);
    GET DIAGNOSTICS k = ROW_COUNT;
    RETURN k;
  END IF;
  -- Stream: ack is a checkpoint; everything up to the highest acked offset is processed.
  UPDATE fluxpg.cursors SET committed = greatest(committed, least((SELECT max(s) FROM unnest(seqs) s) + 1, cursor)),
                            last_commit_at = now()
   WHERE group_id = g.id AND partition = part;
  GET DIAGNOSTICS k = ROW_COUNT;
  RETURN k;
END $$;
COMMENT ON FUNCTION fluxpg.ack(text, text, bigint[], int) IS 'Classic: remove from the pending list (returns how many were pending). Stream: checkpoint past the highest offset';

-- A classic consumer's acknowledgements and its next claim in one transaction (fluxpg.ack of
-- `seqs`, partition 0, then fluxpg.claim): what a consumer acknowledged frees the credit its next
-- claim uses, so the broker carries the acks of a channel that arrived since its last claim in
-- that claim instead of a transaction of their own (issue 17: per-call cost dominated consume +
-- ack). Lock order: the acked pending rows first, then the claim's (cursor row, member row) —
-- the order fluxpg.delete_queue and node_heartbeat take them (pending before cursors); the
-- claim's own pending rows are taken SKIP LOCKED. Acked entries are gone before the claim looks
-- for due redeliveries, so an acknowledged message is never handed out again by it.
CREATE OR REPLACE FUNCTION fluxpg.ack_claim(queue text, grp text, seqs bigint[], consumer text, n int DEFAULT 1)
RETURNS SETOF fluxpg.delivery LANGUAGE plpgsql AS $$
BEGIN
  IF seqs IS NOT NULL AND cardinality(seqs) > 0 THEN
    PERFORM fluxpg.ack(queue, grp, seqs, 0);
  END IF;
  RETURN QUERY SELECT * FROM fluxpg.claim(queue, grp, consumer, n);
END $$;
COMMENT ON FUNCTION fluxpg.ack_claim(text, text, bigint[], text, int) IS 'Classic queues: ack (partition 0) then claim, in one transaction (used by the broker to carry a consumer''s acks in its next claim)';

CREATE OR REPLACE FUNCTION fluxpg.nack(queue text, grp text, seqs bigint[], part int DEFAULT 0)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue);
  g fluxpg.groups := fluxpg._group(q, grp, false);
  initial interval := fluxpg._interval(q.settings #>> '{retry,initial_backoff}');
  maximum interval := fluxpg._interval(q.settings #>> '{retry,max_backoff}');
  mult float8 := coalesce((q.settings #>> '{retry,multiplier}')::float8, 2.0);
  max_deliveries int := 1 + coalesce((q.settings #>> '{retry,max_retries}')::int, 10);
  over bigint[];
  k int;
  d int := 0;
BEGIN
  IF q.kind = 'stream' OR seqs IS NULL OR cardinality(seqs) = 0 THEN
    RETURN 0;  -- stream: nack is a no-op (replay by seeking)
  END IF;
  -- Delivered 1 + max_retries times already: no retry is left, dead-letter now.
  SELECT array_agg(p.seq) INTO over FROM fluxpg.pending p
   WHERE p.group_id = g.id AND p.partition = part AND p.seq BETWEEN fluxpg._lo(seqs) AND fluxpg._hi(seqs) AND p.seq = ANY (seqs) AND p.delivery_count >= max_deliveries;
  IF over IS NOT NULL THEN
    d := fluxpg._dead_letter(q, g, part, over, 'max-deliveries');
  END IF;
  IF NOT coalesce((q.settings #>> '{retry,nack_backoff}')::boolean, false) THEN
    RETURN fluxpg.release(queue, grp, seqs, part) + d;
  END IF;
  UPDATE fluxpg.pending p
     SET visible_at = now() + least(initial * power(mult, greatest(p.delivery_count - 1, 0)), maximum)
   WHERE p.group_id = g.id AND p.partition = part AND p.seq BETWEEN fluxpg._lo(seqs) AND fluxpg._hi(seqs) AND p.seq = ANY (seqs);
  GET DIAGNOSTICS k = ROW_COUNT;
  RETURN k + d;
END $$;
COMMENT ON FUNCTION fluxpg.nack(text, text, bigint[], int) IS 'Classic: redeliver now, or after the retry backoff when retry.nack_backoff is set (dead-letter when retries are used up). Stream: no-op';

-- Give delivered, unacknowledged messages back to their group at once, keeping their delivery
-- count (the next delivery is flagged redelivered): a consumer went away (channel closed,
-- connection lost, cancelled, recover) or asked to requeue. visible_at = -infinity sorts them
-- before anything a timeout or backoff made due, and among themselves by offset, so the group
-- gets them again lowest offset first — the original order. No backoff, no retry counted here
-- (the max_retries check happens at redelivery, in _take_pending). One NOTIFY wakes consumers.
CREATE OR REPLACE FUNCTION fluxpg.release(queue text, grp text, seqs bigint[], part int DEFAULT 0)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue);
  g fluxpg.groups := fluxpg._group(q, grp, false);
  k int;
BEGIN
  IF q.kind = 'stream' OR seqs IS NULL OR cardinality(seqs) = 0 THEN
    RETURN 0;
  END IF;
  UPDATE fluxpg.pending p SET visible_at = '-infinity'
   WHERE p.group_id = g.id AND p.partition = part AND p.seq BETWEEN fluxpg._lo(seqs) AND fluxpg._hi(seqs) AND p.seq = ANY (seqs);
  GET DIAGNOSTICS k = ROW_COUNT;
  IF k > 0 THEN
    PERFORM pg_notify('fluxpg_log', q.id::text);
  END IF;
  RETURN k;
END $$;
COMMENT ON FUNCTION fluxpg.release(text, text, bigint[], int) IS 'Classic: make pending messages deliverable again now, in offset order, keeping their delivery count (requeue without backoff)';

CREATE OR REPLACE FUNCTION fluxpg.reject(queue text, grp text, seqs bigint[], reason text DEFAULT NULL, part int DEFAULT 0)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue);
  g fluxpg.groups := fluxpg._group(q, grp, false);
  pending_seqs bigint[];
  k int;
BEGIN
  IF seqs IS NULL OR cardinality(seqs) = 0 THEN RETURN 0; END IF;
  IF q.kind = 'stream' THEN
    -- Stream: move the cursor past the message so it is not read again; the log keeps it.
    UPDATE fluxpg.cursors SET cursor = greatest(cursor, (SELECT max(s) FROM unnest(seqs) s) + 1)
     WHERE group_id = g.id AND partition = part;
    GET DIAGNOSTICS k = ROW_COUNT;
    RETURN k;
  END IF;
  SELECT array_agg(p.seq) INTO pending_seqs FROM fluxpg.pending p
   WHERE p.group_id = g.id AND p.partition = part AND p.seq BETWEEN fluxpg._lo(seqs) AND fluxpg._hi(seqs) AND p.seq = ANY (seqs);
  IF pending_seqs IS NULL THEN RETURN 0; END IF;
  RETURN fluxpg._dead_letter(q, g, part, pending_seqs, coalesce(reason, 'rejected'));
END $$;
COMMENT ON FUNCTION fluxpg.reject(text, text, bigint[], text, int) IS 'Classic: remove and dead-letter. Stream: advance the cursor past the message';

CREATE OR REPLACE FUNCTION fluxpg.commit(queue text, grp text, seq bigint, part int DEFAULT 0)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue, 'stream', 'commit');
  g fluxpg.groups := fluxpg._group(q, grp, false);
  cur bigint;
BEGIN
  SELECT c.cursor INTO cur FROM fluxpg.cursors c WHERE c.group_id = g.id AND c.partition = part FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = format('queue %L has no partition %s', queue, part);
  END IF;
  IF seq IS NULL OR seq < 0 OR seq > cur THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004',
      MESSAGE = format('cannot commit offset %s for group %L: it must be between 0 and the cursor %s', seq, grp, cur);
  END IF;
  UPDATE fluxpg.cursors SET committed = commit.seq, last_commit_at = now()
   WHERE group_id = g.id AND partition = part;
END $$;
COMMENT ON FUNCTION fluxpg.commit(text, text, bigint, int) IS 'Stream: set the group checkpoint; seq is the first offset not yet processed (every lower one is done)';

CREATE OR REPLACE FUNCTION fluxpg.configure_group(queue text, grp text, auto_commit boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue);
  g fluxpg.groups := fluxpg._group(q, grp);
BEGIN
  UPDATE fluxpg.groups SET auto_commit = configure_group.auto_commit WHERE id = g.id AND groups.auto_commit IS DISTINCT FROM configure_group.auto_commit;
END $$;

-- Where a position string points in one partition: 'first'|'earliest', 'last'|'next'|'latest',
-- '42' or 'offset=42' (clamped to the retained log), 'timestamp=N' (ms when N > 1e12, else s).
CREATE OR REPLACE FUNCTION fluxpg._position(q fluxpg.queues, part int, pos text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
  h fluxpg.heads;
  p text := lower(btrim(pos));
  n numeric;
  ts timestamptz;
  s bigint;
BEGIN
  SELECT * INTO h FROM fluxpg.heads WHERE queue_id = q.id AND partition = part;
  IF p IN ('first', 'earliest', 'beginning') THEN RETURN h.first_seq; END IF;
  IF p IN ('last', 'next', 'latest', 'end') THEN RETURN h.next_seq; END IF;
  IF p ~ '^(offset=)?[0-9]{1,18}$' THEN
    RETURN least(greatest(regexp_replace(p, '^offset=', '')::bigint, h.first_seq), h.next_seq);
  END IF;
  IF p ~ '^timestamp=[0-9]{1,18}(\.[0-9]+)?$' THEN
    n := substr(p, 11)::numeric;
    ts := CASE WHEN n > 1e12 THEN to_timestamp(n / 1000.0) ELSE to_timestamp(n) END;
    -- A binary search over the offsets, not a scan of the log for created_at (no index on it).
    RETURN fluxpg.offset_at(q.name, part, ts);
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'FP004',
    MESSAGE = format('invalid position %L: expected first, last, next, an offset, offset=N or timestamp=N', pos);
END $$;

CREATE OR REPLACE FUNCTION fluxpg.seek(queue text, grp text, "position" text, part int DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue, 'stream', 'seek');
  g fluxpg.groups := fluxpg._group(q, grp);
  result bigint;
  target bigint;
BEGIN
  FOR p IN 0 .. q.partitions - 1 LOOP
    CONTINUE WHEN part IS NOT NULL AND p <> part;
    IF lower(btrim(seek."position")) = 'resume' THEN
      -- Resume: read again from the checkpoint (what was read but not committed comes again).
      UPDATE fluxpg.cursors SET cursor = greatest(committed, (SELECT first_seq FROM fluxpg.heads WHERE queue_id = q.id AND partition = p))
       WHERE group_id = g.id AND partition = p RETURNING cursor INTO target;
    ELSE
      target := fluxpg._position(q, p, seek."position");
      UPDATE fluxpg.cursors SET cursor = target, committed = target, last_commit_at = now()
       WHERE group_id = g.id AND partition = p;
    END IF;
    result := coalesce(result, target);
  END LOOP;
  RETURN result;
END $$;
COMMENT ON FUNCTION fluxpg.seek(text, text, text, int) IS 'Stream: move a group (cursor and checkpoint) to first, last/next, an offset, offset=N or timestamp=N; resume goes back to the checkpoint. Returns the new offset (of the first partition)';

-- The first offset of a queue partition published at or after `ts` (the head when none is): a
-- binary search over the offsets, one index probe per step, so finding a time in a queue of ten
-- million messages takes ~24 probes. created_at follows the offsets (appends to a partition
-- commit in offset order) up to the clock skew between concurrent appenders.
CREATE OR REPLACE FUNCTION fluxpg.offset_at(queue text, part int, ts timestamptz) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue);
  h fluxpg.heads;
  lo bigint;
  hi bigint;
  mid bigint;
  s bigint;
  t timestamptz;
BEGIN
  SELECT * INTO h FROM fluxpg.heads WHERE queue_id = q.id AND partition = part;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'FP004', MESSAGE = format('queue %L has no partition %s', queue, part);
  END IF;
  lo := h.first_seq;
  hi := h.next_seq;           -- invariant: every retained offset < lo is older than ts; hi is an answer
  WHILE lo < hi LOOP
    mid := lo + (hi - lo) / 2;
    -- Retained offsets are contiguous (a head moves only with its rows), so a point lookup,
    -- which touches one segment, finds it; the range scan is for a segment dropped meanwhile.
    SELECT l.seq, l.created_at INTO s, t FROM fluxpg.log l
     WHERE l.queue_id = q.id AND l.partition = part AND l.seq = mid;
    IF NOT FOUND THEN
      SELECT l.seq, l.created_at INTO s, t FROM fluxpg.log l
       WHERE l.queue_id = q.id AND l.partition = part AND l.seq >= mid AND l.seq < hi
       ORDER BY l.seq LIMIT 1;
    END IF;
    IF NOT FOUND THEN
      hi := mid;              -- a gap (dropped segment) up to hi
    ELSIF t >= ts THEN
      hi := s;
    ELSE
      lo := s + 1;
    END IF;
  END LOOP;
  RETURN hi;
END $$;
COMMENT ON FUNCTION fluxpg.offset_at(text, int, timestamptz) IS 'First offset of a queue partition published at or after a time (binary search; the head when none is)';

-- Delete a consumer group: its cursors, members and pending entries. Returns false when there was
-- no such group.
CREATE OR REPLACE FUNCTION fluxpg.delete_group(queue text, grp text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue);
  gid int;
BEGIN
  SELECT id INTO gid FROM fluxpg.groups g WHERE g.queue_id = q.id AND g.name = grp FOR UPDATE;
  IF NOT FOUND THEN RETURN false; END IF;
  DELETE FROM fluxpg.pending WHERE group_id = gid;     -- no foreign key: the hot path skips it
  DELETE FROM fluxpg.groups WHERE id = gid;            -- cursors and members cascade
  RETURN true;
END $$;
COMMENT ON FUNCTION fluxpg.delete_group(text, text) IS 'Delete a consumer group with its cursors, members and pending entries';

-- Move a group of either kind to a position (see fluxpg._position: first, last, N, offset=N,
-- timestamp=N). Streams: fluxpg.seek. Classic groups: the cursor moves, and pending entries at or
-- past the new cursor are dropped (they will be delivered again from the log; kept, they would
-- collide with the new deliveries). Returns the new offset.
CREATE OR REPLACE FUNCTION fluxpg.reset_group(queue text, grp text, "position" text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue);
  g fluxpg.groups;
  target bigint;
BEGIN
  IF q.kind = 'stream' THEN
    RETURN fluxpg.seek(queue, grp, reset_group."position");
  END IF;
  g := fluxpg._group(q, grp);
  target := fluxpg._position(q, 0, reset_group."position");
  -- The entries it drops before the cursor row: the order of fluxpg.ack_claim (acked pending rows,
  -- then the cursor), which would otherwise deadlock with this. A claim meanwhile only adds
  -- entries past the cursor (the DELETE below sees them) and takes due ones SKIP LOCKED.
  PERFORM 1 FROM fluxpg.pending WHERE group_id = g.id AND partition = 0 AND seq >= target FOR UPDATE;
  PERFORM 1 FROM fluxpg.cursors WHERE group_id = g.id AND partition = 0 FOR UPDATE;
  DELETE FROM fluxpg.pending WHERE group_id = g.id AND partition = 0 AND seq >= target;
  UPDATE fluxpg.cursors SET cursor = target WHERE group_id = g.id AND partition = 0;
  RETURN target;
END $$;
COMMENT ON FUNCTION fluxpg.reset_group(text, text, text) IS 'Move a classic or stream group to first, last, an offset or a time; returns the new offset';

-- A node replaces its rows of fluxpg.connections with what it has now (a JSON array of
-- {id, protocol, listener, peer, client_id, username, since}); one statement pair, one transaction.
CREATE OR REPLACE FUNCTION fluxpg.report_connections(node int, conns jsonb) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE k int;
BEGIN
  DELETE FROM fluxpg.connections WHERE node_id = node;
  INSERT INTO fluxpg.connections (node_id, id, protocol, listener, peer, client_id, username, since)
  SELECT node, c.id, c.protocol, c.listener, c.peer, c.client_id, c.username, c.since
    FROM jsonb_to_recordset(coalesce(conns, '[]')) AS c(id bigint, protocol text, listener text, peer text,
                                                         client_id text, username text, since timestamptz)
    -- a node that was declared dead (and removed) while it was away reports nothing
   WHERE EXISTS (SELECT 1 FROM fluxpg.nodes n WHERE n.id = node);
  GET DIAGNOSTICS k = ROW_COUNT;
  RETURN k;
END $$;
COMMENT ON FUNCTION fluxpg.report_connections(int, jsonb) IS 'A node replaces its rows of fluxpg.connections (used by every broker node)';

-- ---------------------------------------------------------------------------------------------
-- Nodes and members
-- ---------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION fluxpg.register_node(host text, pid int) RETURNS int
LANGUAGE sql AS $$
  INSERT INTO fluxpg.nodes (host, pid) VALUES (host, pid) RETURNING id
$$;

-- Heartbeat of a node; nodes silent for longer than `timeout` are removed and the pending
-- entries of their consumers become visible at once (no need to wait for the visibility timeout).
CREATE OR REPLACE FUNCTION fluxpg.node_heartbeat(node int, timeout interval DEFAULT '30 seconds')
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
  dead int[];
  k int;
BEGIN
  UPDATE fluxpg.nodes SET last_seen_at = now() WHERE id = node;
  DELETE FROM fluxpg.log_watchers WHERE until < now();   -- SQL listeners' leases that ended
  SELECT array_agg(id) INTO dead FROM fluxpg.nodes WHERE last_seen_at < now() - timeout AND id <> node;
  IF dead IS NULL THEN RETURN 0; END IF;
  UPDATE fluxpg.pending p SET visible_at = now()
    FROM fluxpg.members m
   WHERE m.node_id = ANY (dead) AND p.group_id = m.group_id AND p.consumer = m.name AND p.visible_at > now();
  GET DIAGNOSTICS k = ROW_COUNT;
  UPDATE fluxpg.cursors c SET owner = NULL, owner_seen_at = NULL
    FROM fluxpg.members m WHERE m.node_id = ANY (dead) AND c.group_id = m.group_id AND c.owner = m.name;
  DELETE FROM fluxpg.members WHERE node_id = ANY (dead);
  DELETE FROM fluxpg.nodes WHERE id = ANY (dead);
  RETURN k;
END $$;

-- ---------------------------------------------------------------------------------------------
-- Retention
-- ---------------------------------------------------------------------------------------------

-- Segments that retention may drop, with the reason. Never the segment holding the head.
-- Classic: below the slowest group's committed offset (no group yet: nothing is dropped), or
-- wholly expired with nothing pending in it. Stream: beyond max_age, max_length_messages or
-- max_length_bytes (counted from the newest segment), or wholly expired.
CREATE OR REPLACE FUNCTION fluxpg.due_segments()
RETURNS TABLE (queue_id int, queue text, partition int, segment regclass, from_seq bigint, to_seq bigint, reason text)
LANGUAGE plpgsql AS $$
DECLARE
  s record;
  floor_seq bigint;
  newest record;
  bytes_total bigint;
  max_age interval;
  ttl interval;
  max_len bigint;
  max_bytes bigint;
  cur_q int := -1;
  cur_p int := -1;
BEGIN
  FOR s IN
    SELECT sl.*, h.next_seq, q.kind, q.settings
      FROM fluxpg._segment_list sl
      JOIN fluxpg.heads h ON h.queue_id = sl.queue_id AND h.partition = sl.partition
      JOIN fluxpg.queues q ON q.id = sl.queue_id
     WHERE sl.to_seq <= h.next_seq
     ORDER BY sl.queue_id, sl.partition, sl.from_seq DESC
  LOOP
    IF s.queue_id <> cur_q OR s.partition <> cur_p THEN
      cur_q := s.queue_id; cur_p := s.partition;
      bytes_total := 0;
      -- The open segment(s) at and above the head count towards max_length_bytes too.
      SELECT coalesce(sum(pg_total_relation_size(o.segment)), 0) INTO bytes_total
        FROM fluxpg._segment_list o WHERE o.queue_id = s.queue_id AND o.partition = s.partition AND o.to_seq > s.next_seq;
      max_age := fluxpg._interval(s.settings #>> '{retention,max_age}');
      ttl := fluxpg._interval(s.settings #>> '{limits,message_ttl}');
      max_len := coalesce((s.settings #>> '{retention,max_length_messages}')::bigint, 0);
      max_bytes := coalesce((s.settings #>> '{retention,max_length_bytes}')::bigint, 0);
      IF s.kind = 'classic' THEN
        SELECT min(coalesce((SELECT min(p.seq) FROM fluxpg.pending p
                              WHERE p.group_id = c.group_id AND p.partition = c.partition), c.cursor))
          INTO floor_seq
          FROM fluxpg.cursors c JOIN fluxpg.groups g ON g.id = c.group_id
         WHERE g.queue_id = s.queue_id AND c.partition = s.partition;
      END IF;
    END IF;
    -- A segment another retention pass (the broker's loop, a concurrent enforce_retention) drops
    -- while this one runs is skipped: looked up by name, so a table gone meanwhile is an
    -- undefined_table error here rather than a failed call (by OID it was a syntax error).
    BEGIN
      EXECUTE format('SELECT created_at, expires_at FROM fluxpg.%I ORDER BY seq DESC LIMIT 1', s.name) INTO newest;
    EXCEPTION WHEN undefined_table THEN
      CONTINUE;
    END;
    bytes_total := bytes_total + coalesce(pg_total_relation_size(s.segment), 0);

    queue_id := s.queue_id; queue := s.queue; partition := s.partition; segment := s.segment;
    from_seq := s.from_seq; to_seq := s.to_seq; reason := NULL;
    IF s.kind = 'classic' THEN
      IF floor_seq IS NOT NULL AND s.to_seq <= floor_seq THEN
        reason := 'acknowledged';
      ELSIF ttl > interval '0' AND (newest IS NULL OR newest.expires_at < now())
            AND NOT EXISTS (SELECT 1 FROM fluxpg.pending p JOIN fluxpg.groups g ON g.id = p.group_id
                             WHERE g.queue_id = s.queue_id AND p.partition = s.partition
                               AND p.seq >= s.from_seq AND p.seq < s.to_seq) THEN
        reason := 'expired';
      END IF;
    ELSE
      IF max_age > interval '0' AND newest.created_at < now() - max_age THEN
        reason := 'max_age';
      ELSIF max_len > 0 AND s.to_seq <= s.next_seq - max_len THEN
        reason := 'max_length_messages';
      ELSIF max_bytes > 0 AND bytes_total > max_bytes THEN
        reason := 'max_length_bytes';
      ELSIF ttl > interval '0' AND newest.expires_at < now() THEN
        reason := 'expired';
      END IF;
    END IF;
    IF reason IS NOT NULL THEN RETURN NEXT; END IF;
  END LOOP;
END $$;
COMMENT ON FUNCTION fluxpg.due_segments() IS 'Segments retention may drop now, with the reason (see fluxpg.enforce_retention)';

-- After a segment is gone: the retained range starts above it, and stream groups whose cursor
-- or checkpoint pointed into it move up to the first retained message.
CREATE OR REPLACE FUNCTION fluxpg._forget_segment(qid int, part int) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE lowest bigint;
BEGIN
  SELECT min(sl.from_seq) INTO lowest FROM fluxpg._segment_list sl WHERE sl.queue_id = qid AND sl.partition = part;
  UPDATE fluxpg.heads SET first_seq = greatest(first_seq, least(coalesce(lowest, next_seq), next_seq))
   WHERE queue_id = qid AND partition = part RETURNING first_seq INTO lowest;
  UPDATE fluxpg.cursors c SET cursor = greatest(c.cursor, lowest), committed = greatest(c.committed, lowest)
    FROM fluxpg.groups g
   WHERE g.id = c.group_id AND g.queue_id = qid AND c.partition = part AND (c.cursor < lowest OR c.committed < lowest);
END $$;

-- Drop due segments now. Callable from any SQL client: it detaches with a short lock
-- (DETACH ... CONCURRENTLY cannot run inside a function); the broker's retention loop detaches
-- concurrently instead. Lock order is the publishers' (the queue's head rows, partition by
-- partition, then its log table), so a concurrent publish waits a moment but never deadlocks.
-- Everything a call locks stays locked until it commits, and publishers of a queue wait for its
-- head rows meanwhile: one call dropping 99 segments held them 370 ms (benchmarks/retention.py).
-- So a call stops once it has held locks for 25 ms (after at least one segment) and leaves the
-- rest due for the next call: call it until it returns 0 to drop a large backlog. A queue whose
-- locks are not free within 25 ms (a long reader of its log) is left for the next call too, so
-- publishers never queue behind a waiting retention for longer than that. Each segment is its
-- own subtransaction. Returns how many segments were dropped.
CREATE OR REPLACE FUNCTION fluxpg.enforce_retention() RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
  s record;
  k int := 0;
  t0 timestamptz;
  held_since timestamptz;
  busy int[] := '{}';
BEGIN
  PERFORM set_config('lock_timeout', '25ms', true);
  -- First, while this transaction holds no head row an appender could be waiting for.
  PERFORM fluxpg.drop_deleted_logs();
  PERFORM fluxpg.sweep_transient();
  PERFORM fluxpg.expire_groups();
  FOR s IN SELECT * FROM fluxpg.due_segments() ORDER BY 1, 3, 5 LOOP
    EXIT WHEN held_since IS NOT NULL AND clock_timestamp() > held_since + interval '25 milliseconds';
    CONTINUE WHEN s.queue_id = ANY (busy);
    t0 := clock_timestamp();
    BEGIN
      PERFORM 1 FROM fluxpg.heads h WHERE h.queue_id = s.queue_id ORDER BY h.partition FOR UPDATE;
      EXECUTE format('ALTER TABLE fluxpg.%I DETACH PARTITION %s', 'log_' || s.queue_id, s.segment);
      EXECUTE format('DROP TABLE %s', s.segment);
      PERFORM fluxpg._forget_segment(s.queue_id, s.partition);
      k := k + 1;
      held_since := coalesce(held_since, t0);
    EXCEPTION WHEN lock_not_available THEN
      busy := busy || s.queue_id;
      RAISE NOTICE 'fluxpg: segment % is busy; retention drops it next time', s.segment;
    END;
  END LOOP;
  RETURN k;
END $$;
COMMENT ON FUNCTION fluxpg.enforce_retention() IS 'Drop segments retention allows dropping now, holding locks for at most ~25 ms; returns how many (call again until 0; never DELETEs from the log)';

-- ---------------------------------------------------------------------------------------------
-- Purge and delete (AMQP 0-9-1 queue.purge / queue.delete, as RabbitMQ does them)
-- ---------------------------------------------------------------------------------------------

-- The log table (with its segments) of a queue whose row is gone. Dropping it locks the table
-- and fluxpg.log itself (ACCESS EXCLUSIVE), which every claim and append of every queue holds a
-- moment. `wait` false (fluxpg.delete_queue, whose row locks a claim of this queue may be
-- waiting for): the queue's table only if nobody holds it now (NOWAIT; a claim holding it could
-- be waiting for us: a deadlock), then fluxpg.log for at most 100 ms (its holders of other
-- queues never wait for this transaction's rows). `wait` true (fluxpg.drop_deleted_logs, in a
-- transaction holding no row locks): up to 100 ms for each. Returns whether it was dropped; a
-- busy table stays for fluxpg.drop_deleted_logs (the retention loop) to drop.
CREATE OR REPLACE FUNCTION fluxpg._drop_log(qid int, wait boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
  tbl text := 'log_' || qid;
  timeout text := current_setting('lock_timeout');
BEGIN
  IF to_regclass(format('fluxpg.%I', tbl)) IS NULL THEN RETURN false; END IF;
  BEGIN
    PERFORM set_config('lock_timeout', '100ms', true);
    EXECUTE format('LOCK TABLE fluxpg.%I IN ACCESS EXCLUSIVE MODE%s', tbl, CASE WHEN wait THEN '' ELSE ' NOWAIT' END);
    EXECUTE format('DROP TABLE fluxpg.%I CASCADE', tbl);
    PERFORM set_config('lock_timeout', timeout, true);
    RETURN true;
  EXCEPTION WHEN lock_not_available THEN   -- the subtransaction's locks and settings are undone
    RAISE NOTICE 'fluxpg: log table % is busy; the retention loop drops it', tbl;
    RETURN false;
  END;
END $$;

-- Log tables of queues that are gone: an operator's DELETE FROM fluxpg.queues leaves them (a
-- cascade cannot drop a table), fluxpg.delete_queue when they were busy. Run by the retention
-- loop (enforce_retention) and by the broker after it deletes a queue. Returns how many it dropped.
CREATE OR REPLACE FUNCTION fluxpg.drop_deleted_logs() RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
  qid int;
  k int := 0;
BEGIN
  FOR qid IN
    SELECT substr(c.relname, 5)::int FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = 'fluxpg.log'::regclass AND c.relname ~ '^log_[0-9]+$'
       AND NOT EXISTS (SELECT 1 FROM fluxpg.queues q WHERE q.id = substr(c.relname, 5)::int)
     ORDER BY 1
  LOOP
    IF fluxpg._drop_log(qid, true) THEN k := k + 1; END IF;
  END LOOP;
  RETURN k;
END $$;
COMMENT ON FUNCTION fluxpg.drop_deleted_logs() IS 'Drop the log tables of deleted queues (an operator''s DELETE FROM fluxpg.queues leaves them); returns how many';


-- Messages of a classic queue that no group has delivered yet (not expired), from the lowest
-- group cursor (no group yet: from the oldest retained message) to the head. Reading them is a
-- count over an offset range: purge and delete are rare, never on the hot path.
CREATE OR REPLACE FUNCTION fluxpg._undelivered(q fluxpg.queues) RETURNS bigint
LANGUAGE sql STABLE AS $$
  SELECT coalesce(sum((SELECT count(*) FROM fluxpg.log l
                        WHERE l.queue_id = q.id AND l.partition = h.partition
                          AND l.seq >= greatest(h.first_seq, coalesce(
                                (SELECT min(c.cursor) FROM fluxpg.cursors c JOIN fluxpg.groups g ON g.id = c.group_id
                                  WHERE g.queue_id = q.id AND c.partition = h.partition), h.first_seq))
                          AND l.seq < h.next_seq
                          AND (l.expires_at IS NULL OR l.expires_at > now()))), 0)::bigint
    FROM fluxpg.heads h WHERE h.queue_id = q.id
$$;

-- queue.purge: every message not yet delivered is skipped — each group's cursor moves to the
-- head (streams: refused, their readers replay by offset). Delivered but unacknowledged
-- messages stay pending and come back if released (nack, channel close), as in RabbitMQ. The
-- log is not touched: retention drops the purged segments once nothing pending holds them.
-- A group created later starts at the oldest retained message like any new group. Returns how
-- many messages were purged (the count the default group had waiting).
CREATE OR REPLACE FUNCTION fluxpg.purge_queue(queue text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue);
  n bigint;
BEGIN
  IF q.kind = 'stream' THEN
    RAISE EXCEPTION USING ERRCODE = 'FP002',
      MESSAGE = format('queue %L is a stream: a stream is not purged (its readers move by offset; retention '
                       'removes old messages)', queue);
  END IF;
  -- The head row locks order this against concurrent appends: nothing appended after the purge
  -- is skipped, nothing before it survives.
  PERFORM 1 FROM fluxpg.heads WHERE queue_id = q.id ORDER BY partition FOR UPDATE;
  n := fluxpg._undelivered(q);
  UPDATE fluxpg.cursors c SET cursor = h.next_seq, committed = greatest(c.committed, h.next_seq)
    FROM fluxpg.groups g, fluxpg.heads h
   WHERE g.id = c.group_id AND g.queue_id = q.id AND h.queue_id = q.id AND h.partition = c.partition
     AND c.cursor < h.next_seq;
  -- The queue's default group (AMQP consumers share it) may not exist yet: create it at the head.
  IF NOT EXISTS (SELECT 1 FROM fluxpg.groups WHERE queue_id = q.id AND name = q.name) THEN
    PERFORM fluxpg._group(q, q.name);
    UPDATE fluxpg.cursors c SET cursor = h.next_seq, committed = h.next_seq
      FROM fluxpg.groups g, fluxpg.heads h
     WHERE g.id = c.group_id AND g.queue_id = q.id AND g.name = q.name AND h.queue_id = q.id AND h.partition = c.partition;
  END IF;
  IF q.durability = 'transient' THEN
    -- Its purged rows leave log_transient now (and give their bytes back to transient_max_bytes).
    PERFORM fluxpg._transient_trim(q, 0, (SELECT h.next_seq FROM fluxpg.heads h WHERE h.queue_id = q.id AND h.partition = 0));
  END IF;
  RETURN n;
END $$;
COMMENT ON FUNCTION fluxpg.purge_queue(text) IS 'Classic queues: skip every undelivered message (group cursors to the head), keep pending ones; returns how many were purged. Streams: refused';

-- queue.delete: drop a queue, its log segments, groups, cursors and pending entries (its
-- dead-letter queue stays, as RabbitMQ keeps a dead-letter target). if_unused: refused while a
-- consumer of another node was seen in the last `in_use_window` (the caller checks its own
-- node's consumers); if_empty: refused while messages wait or are unacknowledged. Returns the
-- number of messages that were waiting. NOTIFY fluxpg_queues (nodes reload) and fluxpg_log
-- (waiting consumers wake, find the queue gone and are cancelled).
CREATE OR REPLACE FUNCTION fluxpg.delete_queue(queue text, if_unused boolean DEFAULT false,
                                               if_empty boolean DEFAULT false,
                                               in_use_window interval DEFAULT '10 seconds')
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  q fluxpg.queues := fluxpg._queue(queue);
  n bigint;
  npending bigint;
  gids int[];
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('fluxpg.declare_queue'), hashtext(q.name));
  IF if_unused AND EXISTS (
       SELECT 1 FROM fluxpg.members m JOIN fluxpg.groups g ON g.id = m.group_id
        WHERE g.queue_id = q.id AND m.last_seen_at > now() - in_use_window
          AND m.node_id IS DISTINCT FROM nullif(current_setting('fluxpg.node_id', true), '')::int) THEN
    RAISE EXCEPTION USING ERRCODE = 'FP008', MESSAGE = format('queue %L in use', queue);
  END IF;
  n := CASE WHEN q.kind = 'classic' THEN fluxpg._undelivered(q)
            ELSE (SELECT coalesce(sum(h.next_seq - h.first_seq), 0) FROM fluxpg.heads h WHERE h.queue_id = q.id) END;
  SELECT count(*) INTO npending FROM fluxpg.pending p JOIN fluxpg.groups g ON g.id = p.group_id WHERE g.queue_id = q.id;
  IF if_empty AND n + npending > 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'FP008',
      MESSAGE = format('queue %L not empty (%s waiting, %s unacknowledged)', queue, n, npending);
  END IF;
  -- Pending rows first, as a claim takes them (SKIP LOCKED, before its cursor row): a consumer
  -- acking or claiming meanwhile finishes, and this waits. pending has no foreign key (it is the
  -- hottest table); its rows go by group id. Then the queue row, whose cascade locks heads,
  -- groups, cursors and members in the order every consumer follows (see _touch_member).
  gids := ARRAY(SELECT id FROM fluxpg.groups WHERE queue_id = q.id);
  DELETE FROM fluxpg.pending WHERE group_id = ANY (gids);
  DELETE FROM fluxpg.queues WHERE id = q.id;          -- heads, groups, cursors, members cascade
  -- Entries a claim inserted while it held a cursor row the cascade waited for. SKIP LOCKED: a
  -- row another claim holds belongs to a claim now waiting for this transaction (a cursor row);
  -- waiting for it in turn would be a deadlock. Such a claim fails once this commits.
  DELETE FROM fluxpg.pending WHERE (group_id, partition, seq) IN (
    SELECT p.group_id, p.partition, p.seq FROM fluxpg.pending p WHERE p.group_id = ANY (gids) FOR UPDATE SKIP LOCKED);
  PERFORM fluxpg._drop_log(q.id, false);
  PERFORM pg_notify('fluxpg_queues', q.id::text);
  PERFORM pg_notify('fluxpg_log', q.id::text);
  RETURN n;
END $$;
COMMENT ON FUNCTION fluxpg.delete_queue(text, boolean, boolean, interval) IS 'Drop a queue with its log segments, groups and pending entries (if_unused / if_empty as AMQP queue.delete); returns the messages that were waiting';
