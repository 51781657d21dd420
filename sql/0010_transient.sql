-- Transient queues (issue 11, migration 0010_transient): queues that live until their node stops
-- (AMQP 0-9-1 exclusive / auto-delete / non-durable / server-named queues, AMQP 1.0 dynamic
-- nodes, `queue_manager.auto_create: transient`), with the classic queue's semantics because the
-- SAME SQL functions drive them: a transient queue is a classic row in fluxpg.queues, with a head,
-- groups, cursors and pending entries like any other; only its messages live elsewhere.
--
-- Where its messages live: a transient queue gets no LIST partition of its own (creating one is
-- DDL: an ACCESS EXCLUSIVE-free but still catalog-heavy CREATE + ATTACH per queue, too slow for an
-- RPC client that declares a reply queue per call), so its rows fall into the log's DEFAULT
-- partition, which is UNLOGGED: no WAL, and PostgreSQL empties it after a crash — exactly the
-- transient promise (only messages of queues declared transient are lost, and only when the
-- broker or the database goes down).

ALTER TABLE fluxpg.queues
    ADD COLUMN durability  text NOT NULL DEFAULT 'durable' CHECK (durability IN ('durable', 'transient')),
    ADD COLUMN owner_node  int REFERENCES fluxpg.nodes (id) ON DELETE CASCADE,
    ADD COLUMN owner       text,
    ADD COLUMN auto_delete boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT queues_transient_owner CHECK (durability = 'durable' OR owner_node IS NOT NULL);
COMMENT ON COLUMN fluxpg.queues.durability IS 'durable (logged partition of its own, survives restarts) or transient (rows in fluxpg.log_transient, removed with its node)';
COMMENT ON COLUMN fluxpg.queues.owner_node IS 'Transient queues: the node that created it; the queue goes when the node row does (clean stop, or missed heartbeats)';
COMMENT ON COLUMN fluxpg.queues.owner IS 'Exclusive transient queues: the owning connection (<node>:<connection>); other connections are refused';
COMMENT ON COLUMN fluxpg.queues.auto_delete IS 'Transient queues: deleted when their last consumer leaves (AMQP auto-delete)';
CREATE INDEX queues_owner_node ON fluxpg.queues (owner_node) WHERE owner_node IS NOT NULL;

-- Bytes of payload a transient queue holds (maintained for transient queues only: their sum is
-- bounded by queue_manager.transient_max_bytes; durable queues are bounded by disk and retention).
ALTER TABLE fluxpg.heads ADD COLUMN bytes bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN fluxpg.heads.bytes IS 'Transient queues: payload bytes currently held (bounded broker-wide by transient_max_bytes); 0 for durable queues';

CREATE UNLOGGED TABLE fluxpg.log_transient PARTITION OF fluxpg.log DEFAULT;
COMMENT ON TABLE fluxpg.log_transient IS 'Messages of transient queues (the log''s DEFAULT partition, UNLOGGED: emptied by a crash). Rows are DELETEd on ack and with their queue';

-- BEFORE DELETE trigger on queues for transient rows (by delete_transient, by a node's row going
-- away with ON DELETE CASCADE, or by hand): their messages and pending entries go too. A DELETE
-- is right here although the log is otherwise never DELETEd from: log_transient is UNLOGGED
-- (no WAL for the delete), holds only short-lived queues, and per-queue tables that could be
-- dropped instead would mean DDL for every reply queue an RPC client declares.
CREATE OR REPLACE FUNCTION fluxpg._transient_cleanup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM fluxpg.pending p USING fluxpg.groups g WHERE g.queue_id = OLD.id AND p.group_id = g.id;
  DELETE FROM fluxpg.log WHERE queue_id = OLD.id;
  PERFORM pg_notify('fluxpg_queues', 't-' || OLD.id);
  RETURN OLD;
END $$;

CREATE TRIGGER queues_transient_cleanup BEFORE DELETE ON fluxpg.queues
    FOR EACH ROW WHEN (OLD.durability = 'transient') EXECUTE FUNCTION fluxpg._transient_cleanup();
