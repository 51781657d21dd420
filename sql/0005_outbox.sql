-- Revision 0005_outbox: publishing inside the caller's transaction (the outbox without a relay).
-- Frozen DDL of this revision; the functions it names live in functions.sql.

-- fluxpg.publish() writes here, in the caller's transaction, without touching the queue's head row;
-- a deferred constraint trigger moves the transaction's rows into the log when it commits (in the
-- pre-commit phase, so the head lock is held only for the commit itself). A row never outlives its
-- transaction: it is appended at commit or vanishes with a rollback. Hence UNLOGGED: no WAL for
-- rows that exist only inside one transaction.
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
COMMENT ON TABLE fluxpg.staged IS 'Outbox rows of open transactions that called fluxpg.publish(); appended to the log when their transaction commits (trigger staged_append_at_commit), gone with a rollback';
COMMENT ON COLUMN fluxpg.staged.txid IS 'The publishing transaction: its rows are appended together at its commit';
COMMENT ON COLUMN fluxpg.staged.part_key IS 'Partition key (the x-partition-key header), else the routing key decides, as for a direct publish';

-- The commit-time move. It fires once per staged row; the first firing moves all of the
-- transaction's rows, the others find none (one index probe each).
CREATE OR REPLACE FUNCTION fluxpg._append_staged() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  qids int[]; topics text[]; payloads bytea[]; hdrs jsonb[]; keys text[];
BEGIN
  WITH taken AS (DELETE FROM fluxpg.staged s WHERE s.txid = pg_current_xact_id() RETURNING s.*)
  SELECT array_agg(t.queue_id ORDER BY t.id), array_agg(t.topic ORDER BY t.id), array_agg(t.payload ORDER BY t.id),
         array_agg(t.headers ORDER BY t.id), array_agg(t.part_key ORDER BY t.id)
    INTO qids, topics, payloads, hdrs, keys
    FROM taken t;
  IF qids IS NOT NULL THEN
    PERFORM fluxpg.append_batch(qids, topics, payloads, hdrs, keys);
  END IF;
  RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER staged_append_at_commit AFTER INSERT ON fluxpg.staged
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fluxpg._append_staged();
