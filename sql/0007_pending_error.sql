-- Revision 0007_pending_error: why a pending entry could not be dead-lettered (e.g. its DLQ is
-- full). claim() parks such an entry (visible again after the visibility timeout) instead of
-- failing every claim of the group; the reason shows in fluxpg.pending_entries.
ALTER TABLE fluxpg.pending ADD COLUMN last_error text;
COMMENT ON COLUMN fluxpg.pending.last_error IS 'Why the last attempt to dead-letter this entry failed (NULL: none failed); the entry is parked and retried after the visibility timeout';
