-- Revision 0005_outbox: publishing inside the caller's transaction (the outbox without a relay).
-- Frozen DDL of this revision; the functions it names live in functions.sql.

-- fluxpg.publish() writes into fluxpg.staged, in the caller's transaction, without touching the
-- queue's head row. At the caller's commit (pre-commit phase) the deferred constraint trigger
-- staged_commit moves the transaction's rows into fluxpg.outbox: outbox ids are taken then, so
-- they follow commit order. The sequencer (fluxpg.sequence_staged(), run by every broker node)
-- appends outbox rows to the log in id order, in short transactions of its own. No lock is held
-- across the application's transaction, commits of publishing transactions run in parallel (no
-- NOTIFY from them either: NOTIFY serialises commits), and a rollback leaves no trace.
-- fluxpg.staged is scratch space that never outlives its transaction: UNLOGGED, no WAL.
CREATE UNLOGGED TABLE fluxpg.staged (
    id        bigserial PRIMARY KEY,
    txid      xid8 NOT NULL DEFAULT pg_current_xact_id(),
    queue_id  int NOT NULL,
    topic     text NOT NULL,
    payload   bytea NOT NULL,
    headers   jsonb,
    part_key  text
);
CREATE INDEX staged_txid ON fluxpg.staged (txid);
COMMENT ON TABLE fluxpg.staged IS 'Messages of open transactions that called fluxpg.publish(); moved to fluxpg.outbox when their transaction commits (trigger staged_commit), gone with a rollback';
COMMENT ON COLUMN fluxpg.staged.txid IS 'The publishing transaction: its rows move together at its commit';

CREATE TABLE fluxpg.outbox (
    id           bigserial PRIMARY KEY,
    queue_id     int NOT NULL,
    topic        text NOT NULL,
    payload      bytea NOT NULL,
    headers      jsonb,
    part_key     text,
    committed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    attempts     int NOT NULL DEFAULT 0,
    last_error   text
);
COMMENT ON TABLE fluxpg.outbox IS 'Messages of committed transactions (fluxpg.publish) waiting for the sequencer to append them to the log, in id (= commit) order';
COMMENT ON COLUMN fluxpg.outbox.id IS 'Taken at the publishing transaction''s commit: the order the sequencer appends in';
COMMENT ON COLUMN fluxpg.outbox.queue_id IS 'Target queue (not a foreign key: rows of a dropped queue are discarded by the sequencer)';
COMMENT ON COLUMN fluxpg.outbox.part_key IS 'Partition key (the x-partition-key header), else the routing key decides, as for a direct publish';
COMMENT ON COLUMN fluxpg.outbox.attempts IS 'How often appending it failed (e.g. queue full); it waits, in order, until it fits';
COMMENT ON COLUMN fluxpg.outbox.last_error IS 'Why the last append failed';

-- Commit-time move, once per transaction: the first firing moves all of the transaction's rows,
-- the others find none (one index probe each).
CREATE OR REPLACE FUNCTION fluxpg._commit_staged() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  WITH taken AS (DELETE FROM fluxpg.staged s WHERE s.txid = pg_current_xact_id() RETURNING s.*)
  INSERT INTO fluxpg.outbox (queue_id, topic, payload, headers, part_key)
  SELECT t.queue_id, t.topic, t.payload, t.headers, t.part_key FROM taken t ORDER BY t.id;
  RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER staged_commit AFTER INSERT ON fluxpg.staged
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fluxpg._commit_staged();
