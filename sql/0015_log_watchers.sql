-- Revision 0015_log_watchers: who waits for a queue's appends on another connection.
-- Frozen DDL of this revision.
--
-- Why: every committed append sent NOTIFY fluxpg_log, and PostgreSQL signals every LISTENing
-- backend of the database on each NOTIFY (whatever its channel); each woken backend and each
-- broker reading the notification cost CPU per committed batch even when nobody consumed the queue
-- anywhere else (pika confirming each publish, no consumer, one node: ~100 µs of the ~630 µs per
-- message, measured by removing the NOTIFY). A broker node's own consumers are woken by the node
-- itself at commit. So an append by a node (tagged with it) NOTIFYs a queue only while a row here
-- says that another node has consumers of it, or that a SQL listener holds a lease on it
-- (fluxpg.watch_log). Appends by anyone else (untagged: applications, the SQL API) always NOTIFY.
CREATE TABLE fluxpg.log_watchers (
    queue_id  int NOT NULL REFERENCES fluxpg.queues (id) ON DELETE CASCADE,
    watcher   text NOT NULL,
    node_id   int REFERENCES fluxpg.nodes (id) ON DELETE CASCADE,
    until     timestamptz,
    PRIMARY KEY (queue_id, watcher),
    CHECK ((node_id IS NOT NULL AND until IS NULL) OR (node_id IS NULL AND until IS NOT NULL))
);
CREATE INDEX log_watchers_node ON fluxpg.log_watchers (node_id) WHERE node_id IS NOT NULL;
COMMENT ON TABLE fluxpg.log_watchers IS 'Who waits for appends to a queue on another connection: a broker node with consumers of it (the row goes with the node), or a SQL listener''s lease (fluxpg.watch_log). A node''s appends NOTIFY fluxpg_log only for queues watched by someone else';
COMMENT ON COLUMN fluxpg.log_watchers.watcher IS 'node:<node id>, or the name a SQL listener gave fluxpg.watch_log';
COMMENT ON COLUMN fluxpg.log_watchers.until IS 'A SQL listener''s lease ends then (renewed by calling fluxpg.watch_log again)';
