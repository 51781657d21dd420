-- Revision 0016_route_changes: a version of the routing table that fluxpg.publish can check
-- cheaply. Frozen DDL of this revision.
--
-- Why: fluxpg.publish (inside an application's transaction) routed every message over every
-- queue's topic bindings: 44 µs of the ~285 µs of backend CPU of a one-message transaction with
-- four queues (one connection, /proc schedstat), more with more queues. A session now keeps its
-- last single-queue route (topic → queue) with the routing version it was computed at, and
-- reuses it while that version is still the current one.
--
-- The version is the sum of `weight` over this table: every change of a row of fluxpg.queues
-- that routing reads (its name, topics or settings; a queue created or deleted) inserts a row of
-- weight 1 in the changing transaction. Insert-only, so no change waits for another, and the sum
-- a snapshot sees counts exactly the changes committed before it: it grows with each one and never
-- comes back to a value an earlier snapshot saw, so a route cached with the version its own
-- snapshot read can never pass for a later routing table. (A max() over ids or a sequence would
-- not do: ids are taken before commit, and two changes can commit in the other order.)
-- fluxpg._compact_route_changes() folds the rows into one of the same total.
CREATE TABLE fluxpg.route_changes (
    weight bigint NOT NULL DEFAULT 1 CHECK (weight > 0)
);
COMMENT ON TABLE fluxpg.route_changes IS 'Routing version (sum of weight): one row per committed change of fluxpg.queues that routing reads; fluxpg.publish reuses a session''s cached route while the sum is what it was';
COMMENT ON COLUMN fluxpg.route_changes.weight IS 'Changes this row stands for (1, or the total of rows folded into it by fluxpg._compact_route_changes)';

CREATE FUNCTION fluxpg._route_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO fluxpg.route_changes DEFAULT VALUES;
  RETURN NULL;
END $$;

-- Row level, and an update only when what routing reads differs: a statement that changes no row
-- (a sweep that found nothing, the cascade of a node's deletion) or a re-declaration with the same
-- settings (every broker start re-declares its configured queues) leaves every session's cached
-- route valid. A bulk change adds a row per queue; the heartbeat folds them.
CREATE TRIGGER queues_route_row AFTER INSERT OR DELETE ON fluxpg.queues
  FOR EACH ROW EXECUTE FUNCTION fluxpg._route_changed();
CREATE TRIGGER queues_route_update AFTER UPDATE OF name, topics, settings ON fluxpg.queues
  FOR EACH ROW WHEN (OLD.name IS DISTINCT FROM NEW.name OR OLD.topics IS DISTINCT FROM NEW.topics
                     OR OLD.settings IS DISTINCT FROM NEW.settings)
  EXECUTE FUNCTION fluxpg._route_changed();
CREATE TRIGGER queues_route_truncate AFTER TRUNCATE ON fluxpg.queues
  FOR EACH STATEMENT EXECUTE FUNCTION fluxpg._route_changed();
