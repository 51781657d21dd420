-- Named queries of deleting queues (fluxpg.queues.manager, fluxpg.queues.retention). Each starts
-- with `-- name: x`.

-- name: drop_deleted_logs
-- Log tables of deleted queues, dropped in a transaction of their own (no row locks held, so
-- waiting for the tables cannot close a cycle with a consumer; see fluxpg._drop_log).
SELECT fluxpg.drop_deleted_logs();
