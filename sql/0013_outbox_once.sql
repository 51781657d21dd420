-- Revision 0013_outbox_once: a message published inside the caller's transaction is written once.
-- Frozen DDL of this revision; the functions it names live in functions.sql.
--
-- Before (0005_outbox): fluxpg.publish() inserted into the unlogged fluxpg.staged, and a deferred
-- trigger moved the transaction's rows into fluxpg.outbox at commit (a delete and a second,
-- logged insert of every payload) so that outbox ids followed commit order.
-- Now fluxpg.publish() inserts the message straight into fluxpg.outbox (logged, in the caller's
-- transaction, tagged with its transaction id) and, at its commit, a deferred trigger inserts a
-- small row into fluxpg.outbox_commits: its cseq, taken from a sequence in the commit's pre-commit
-- phase, orders transactions by commit. The sequencer appends transactions in
-- cseq order, and a transaction's messages in id order. Nothing holds a lock another publisher
-- waits for; the rows are invisible to everyone (the sequencer included) until the commit, gone
-- with a rollback, and durable with the commit (row and marker commit or vanish together).
--
-- Why a commit-time sequence and not the transaction ids alone (PgQ's txid + snapshot horizon):
-- txid order is the order transactions started writing, not the order they committed; a
-- horizon ("only number rows older than the oldest running transaction") would give txid order
-- and make every message wait for the longest open transaction, which is what the outbox must not
-- do. The marker costs one small insert per fluxpg.publish call.

DROP TRIGGER staged_commit ON fluxpg.staged;
DROP TABLE fluxpg.staged;
DROP FUNCTION fluxpg._commit_staged();

CREATE TABLE fluxpg.outbox_commits (
    cseq  bigserial PRIMARY KEY,
    txid  xid8 NOT NULL
);
COMMENT ON TABLE fluxpg.outbox_commits IS 'Commit-order markers of committed transactions whose fluxpg.outbox messages wait for the sequencer: one per fluxpg.publish call, inserted at the commit (trigger outbox_commit)';
COMMENT ON COLUMN fluxpg.outbox_commits.cseq IS 'Taken in the transaction''s pre-commit phase: the sequencer appends transactions in this order';
COMMENT ON COLUMN fluxpg.outbox_commits.txid IS 'The transaction (fluxpg.outbox.txid of its messages)';

-- Rows already committed under 0005 keep their order, ahead of anything published from now on:
-- one marker for all of them, under a transaction id no transaction has (xid8 1 is
-- FrozenTransactionId's, pg_current_xact_id() never returns it).
ALTER TABLE fluxpg.outbox ADD COLUMN txid xid8;
UPDATE fluxpg.outbox SET txid = '1';
INSERT INTO fluxpg.outbox_commits (txid) SELECT '1' WHERE EXISTS (SELECT 1 FROM fluxpg.outbox);
ALTER TABLE fluxpg.outbox ALTER COLUMN txid SET NOT NULL, ALTER COLUMN txid SET DEFAULT pg_current_xact_id();
ALTER TABLE fluxpg.outbox DROP CONSTRAINT outbox_pkey, ADD PRIMARY KEY (txid, id);
ALTER TABLE fluxpg.outbox RENAME COLUMN committed_at TO published_at;
COMMENT ON TABLE fluxpg.outbox IS 'Messages published with fluxpg.publish(), written in the publishing transaction (invisible until it commits); the sequencer appends them to the log in commit order (fluxpg.outbox_commits) and deletes them';
COMMENT ON COLUMN fluxpg.outbox.id IS 'Order of the messages within their transaction';
COMMENT ON COLUMN fluxpg.outbox.txid IS 'The publishing transaction (pg_current_xact_id()): its fluxpg.outbox_commits row says when it committed';
COMMENT ON COLUMN fluxpg.outbox.published_at IS 'When fluxpg.publish() wrote it';

-- At the commit of a transaction that published: the constraint trigger is deferred, so it fires
-- in the pre-commit phase, and only for rows with `marks` (fluxpg.publish sets it on the first
-- row of each call: one marker per call, not per message; the WHEN clause keeps the other rows
-- from queueing an event at all). A rolled-back savepoint takes its rows, their events and any
-- marker with it. The sequencer takes a transaction's markers together, ordered by the first.
-- No NOTIFY here: one per commit would serialise the publishers' commits on PostgreSQL's
-- notification lock; the sequencer polls (fluxpg/queues/sequencer.py).
ALTER TABLE fluxpg.outbox ADD COLUMN marks boolean NOT NULL DEFAULT true;
COMMENT ON COLUMN fluxpg.outbox.marks IS 'Its commit-time trigger inserts the transaction''s fluxpg.outbox_commits marker (fluxpg.publish sets it on the first row of each call only; a transaction whose rows all lack it is never appended)';

CREATE FUNCTION fluxpg._outbox_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO fluxpg.outbox_commits (txid) VALUES (NEW.txid);
  RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER outbox_commit AFTER INSERT ON fluxpg.outbox
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.marks) EXECUTE FUNCTION fluxpg._outbox_commit();
