-- Revision 0014_pending_due: fluxpg.pending_due becomes a partial index (WHERE visible_at IS NOT
-- NULL, which every row satisfies: the column is NOT NULL) so that only queries that say something
-- about visible_at can use it.
-- Frozen DDL of this revision.
--
-- Why: the ack's DELETE (group, partition, offsets) could use either index, both leading with
-- group_id. Once VACUUM had run on fluxpg.pending (autovacuum on a normal server, the broker's own
-- since this revision's companion change) its statistics said "nearly empty", both plans cost the
-- same, and the planner took pending_due, whose only usable condition is group_id: each ack then
-- read every entry of the group, dead ones included. Measured with 10,000 messages claimed and
-- acked 100 at a time: 10-13 µs of backend CPU per message before the first VACUUM, 32-45 after it;
-- with this index 15-17 after it. The queries for due redeliveries (visible_at <= now(), which
-- proves visible_at IS NOT NULL) still use the index.
-- Building it takes a SHARE lock on fluxpg.pending for as long as the build (publishes go on;
-- claims and acks wait): the pending entry list is usually small.
DROP INDEX fluxpg.pending_due;
CREATE INDEX pending_due ON fluxpg.pending (group_id, visible_at) WHERE visible_at IS NOT NULL;
COMMENT ON INDEX fluxpg.pending_due IS 'Due redeliveries of a group (visible_at <= now()): partial on purpose, so that queries not about visible_at (an ack by offsets) never read it';
