"""Outbox written once: fluxpg.publish() inserts into fluxpg.outbox in the caller's transaction and
a commit-time marker (fluxpg.outbox_commits) orders transactions by commit; fluxpg.staged and its
move at commit are gone (issue 15).

Revision ID: 0013_outbox_once
Revises: 0012_mqtt_offline_log
Create Date: 2026-11-23
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0013_outbox_once"
down_revision = "0012_mqtt_offline_log"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "0013_outbox_once.sql")


# 0005_outbox's objects, as that revision creates them (its file is frozen DDL: the same text).
_STAGED = """
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
COMMENT ON TABLE fluxpg.outbox IS 'Messages of committed transactions (fluxpg.publish) waiting for the sequencer to append them to the log, in id (= commit) order';
COMMENT ON COLUMN fluxpg.outbox.id IS 'Taken at the publishing transaction''s commit: the order the sequencer appends in';
"""


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS outbox_commit ON fluxpg.outbox")
    op.execute("DROP FUNCTION IF EXISTS fluxpg._outbox_commit()")
    # Committed messages keep their commit order: renumbered in (marker, id) order, then 0005's
    # ordering by id alone holds.
    op.execute("""
        CREATE TEMP TABLE outbox_down ON COMMIT DROP AS
        SELECT row_number() OVER (ORDER BY c.cseq, o.id) AS k, o.queue_id, o.topic, o.payload, o.headers,
               o.part_key, o.published_at, o.attempts, o.last_error
          FROM fluxpg.outbox o
          JOIN (SELECT txid, min(cseq) AS cseq FROM fluxpg.outbox_commits GROUP BY txid) c ON c.txid = o.txid;
        DELETE FROM fluxpg.outbox;
        ALTER TABLE fluxpg.outbox RENAME COLUMN published_at TO committed_at;
        COMMENT ON COLUMN fluxpg.outbox.committed_at IS NULL;
        ALTER TABLE fluxpg.outbox DROP CONSTRAINT outbox_pkey;
        ALTER TABLE fluxpg.outbox DROP COLUMN txid;
        ALTER TABLE fluxpg.outbox DROP COLUMN marks;
        ALTER TABLE fluxpg.outbox ADD PRIMARY KEY (id);
        INSERT INTO fluxpg.outbox (queue_id, topic, payload, headers, part_key, committed_at, attempts, last_error)
        SELECT queue_id, topic, payload, headers, part_key, published_at, attempts, last_error
          FROM outbox_down ORDER BY k;
        DROP TABLE fluxpg.outbox_commits;
    """)
    op.execute(_STAGED)
