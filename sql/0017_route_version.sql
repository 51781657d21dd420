-- Revision 0017_route_version: the routing version fluxpg.publish checks moves from a table
-- (fluxpg.route_changes, 0016) into the catalog, where checking it costs nothing. Frozen DDL of
-- this revision.
--
-- Why: a session reuses its last single-queue route while the routing version is the one the route
-- was computed at (0016). Reading the version from fluxpg.route_changes was a second relation in
-- every fluxpg.publish (its lock, open and scan: ~15-20 µs of a ~240 µs one-message transaction,
-- benchmarks/outbox_costs.py, issue 15's throughput target). Now the version is the constant that
-- the SQL function fluxpg._route_version() returns, and every routing change replaces that
-- function with a new constant. PostgreSQL inlines an IMMUTABLE SQL function's constant into the
-- plans that call it and invalidates those plans when the function is replaced: a session sees a
-- change at its next transaction start (or new relation lock), checked by a comparison of two
-- numbers. The values come from a sequence: never reused, even by changes that roll back.
--
-- Which changes count: every change of a durable queue that routing reads (created, deleted, its
-- name, topics or settings changed) and a TRUNCATE. Not a transient queue's creation or deletion:
-- revision 0010 keeps those free of DDL (RPC clients declare a reply queue per call), and
-- fluxpg.publish caches no route that one could change. A transient queue binds only
-- $queue/<its name>/#, so only topics under $queue/<that name>/ route differently with it. A
-- cached route goes to a durable queue, and its topic is either outside $queue/ or under that
-- queue's own $queue/<name>/, a name no transient queue can take while the queue exists.
--
-- Two routing changes at once would both replace the function's pg_proc row, and the second would
-- fail ("tuple concurrently updated"): they take the advisory lock (1179669332, -2) first and hold
-- it to their commit. Durable queue creations were serialised already (ACCESS EXCLUSIVE on
-- fluxpg.log, _lock_log_for_new_queue, taken after this trigger).
--
-- The trigger function runs as its owner (SECURITY DEFINER), who owns fluxpg._route_version():
-- a broker whose role may change queues but owns no function can still create them.
-- fluxpg._route_version() holds state, not code: fluxpg.routines neither drops it nor counts it
-- in the fingerprint of the installed definitions (sql/routines.sql).

-- Versions start above every sum of route_changes: a session that cached a route under 0016 holds
-- such a sum, and it must not pass for a version of this revision.
CREATE SEQUENCE fluxpg.route_versions;
COMMENT ON SEQUENCE fluxpg.route_versions IS 'Routing versions: each routing change takes the next one into fluxpg._route_version()';
SELECT setval('fluxpg.route_versions', (SELECT coalesce(sum(weight), 0)::bigint + 1 FROM fluxpg.route_changes), false);
DROP TABLE fluxpg.route_changes;

-- Until the first routing change: -1, a number no version and no sum of route_changes is, so no
-- route cached before this revision is reused.
CREATE FUNCTION fluxpg._route_version() RETURNS bigint
IMMUTABLE PARALLEL SAFE LANGUAGE sql AS $$ SELECT -1::bigint $$;
COMMENT ON FUNCTION fluxpg._route_version() IS 'The routing version: a constant, replaced by every committed routing change (trigger function fluxpg._route_changed); fluxpg.publish reuses a session''s cached route while it is the one the route was computed at';

CREATE OR REPLACE FUNCTION fluxpg._route_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  version bigint;
BEGIN
  IF TG_LEVEL = 'ROW' THEN
    IF TG_OP = 'INSERT' AND NEW.durability = 'transient' THEN RETURN NULL; END IF;
    IF TG_OP = 'DELETE' AND OLD.durability = 'transient' THEN RETURN NULL; END IF;
    IF TG_OP = 'UPDATE' AND OLD.durability = 'transient' AND NEW.durability = 'transient' THEN RETURN NULL; END IF;
  END IF;
  PERFORM pg_advisory_xact_lock(1179669332, -2);
  version := nextval('fluxpg.route_versions');
  EXECUTE format('CREATE OR REPLACE FUNCTION fluxpg._route_version() RETURNS bigint '
                 'IMMUTABLE PARALLEL SAFE LANGUAGE sql AS %L', format('SELECT %s::bigint', version));
  RETURN NULL;
END $$;
