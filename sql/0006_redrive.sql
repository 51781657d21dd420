-- Redrive bookkeeping (migration 0006_redrive). The log is never UPDATEd or DELETEd, so a dead
-- letter moved back to its queue leaves the DLQ by a row here, written in the same transaction as
-- its new copy in the original queue (fluxpg.redrive): every snapshot sees the message in exactly
-- one of the two queues. Claims from the DLQ skip these offsets; browsing hides them.
CREATE TABLE fluxpg.redriven (
    queue_id     int NOT NULL REFERENCES fluxpg.queues (id) ON DELETE CASCADE,
    partition    int NOT NULL,
    seq          bigint NOT NULL,
    to_queue_id  int NOT NULL,
    to_partition int NOT NULL,
    to_seq       bigint NOT NULL,
    redriven_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, partition, seq)
);
COMMENT ON TABLE fluxpg.redriven IS 'Dead letters moved back to their queue by fluxpg.redrive: the DLQ offset and the new offset it got';
COMMENT ON COLUMN fluxpg.redriven.seq IS 'Offset of the message in the dead-letter queue (it no longer counts as in that queue)';
COMMENT ON COLUMN fluxpg.redriven.to_seq IS 'Offset of the new message in the original queue (to_queue_id, to_partition)';
