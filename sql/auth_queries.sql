-- Named queries of broker users (fluxpg.auth_config through the queue manager). Each starts with
-- `-- name: x`.

-- name: auth_user
-- A user of fluxpg.users: password hash and permissions (JSON array, NULL = everything).
SELECT password_hash, permissions FROM fluxpg.users WHERE username = $1;
