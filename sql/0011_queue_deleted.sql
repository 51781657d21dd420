-- Revision 0011_queue_deleted: every node hears of a durable or stream queue that goes away,
-- however it went (fluxpg.delete_queue, the CLI, or an operator's DELETE in psql), and ends its
-- consumers of it at once (AMQP basic.cancel) instead of when their next claim fails. Transient
-- queues have their own notification (queues_transient_cleanup, 't-<id>').
CREATE OR REPLACE FUNCTION fluxpg._queue_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('fluxpg_queues', OLD.id::text);
  RETURN NULL;
END $$;

CREATE TRIGGER queues_deleted_notify AFTER DELETE ON fluxpg.queues
    FOR EACH ROW WHEN (OLD.durability <> 'transient') EXECUTE FUNCTION fluxpg._queue_deleted();
COMMENT ON TRIGGER queues_deleted_notify ON fluxpg.queues IS 'NOTIFY fluxpg_queues when a durable or stream queue is deleted, so every node ends its consumers of it';
