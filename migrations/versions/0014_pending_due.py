"""pending_due only for queries about visible_at: after VACUUM the planner took it for the ack's
DELETE by offsets and read every pending entry of the group per ack.

Revision ID: 0014_pending_due
Revises: 0013_outbox_once
Create Date: 2026-11-24
"""
from alembic import op

from fluxpg.db import run_sql_file

revision = "0014_pending_due"
down_revision = "0013_outbox_once"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(op.get_bind(), "0014_pending_due.sql")


# A trigger's function stays when the routines are dropped below head, replaced in place by
# functions.sql (it wakes a sleeping sequencer there): back at 0013 it is 0013's, as
# sql/0013_outbox_once.sql creates it.
_OUTBOX_COMMIT_0013 = """
CREATE OR REPLACE FUNCTION fluxpg._outbox_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO fluxpg.outbox_commits (txid) VALUES (NEW.txid);
  RETURN NULL;
END $$;
"""


def downgrade() -> None:
    op.execute("DROP INDEX fluxpg.pending_due")
    op.execute("CREATE INDEX pending_due ON fluxpg.pending (group_id, visible_at)")
    op.execute(_OUTBOX_COMMIT_0013)
