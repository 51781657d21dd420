-- Broker users (migration 0003_auth): who may log in over MQTT, AMQP 0-9-1 and AMQP 1.0 when the
-- config has an `auth:` section. Users in the config are checked first, then these rows. Only
-- password hashes are stored, never passwords: make one with `fluxpg passwd`, e.g.
--   INSERT INTO fluxpg.users (username, password_hash, permissions)
--   VALUES ('alice', 'scrypt$16384$8$1$…$…', '[{"action": "publish", "pattern": "$queue/orders/#"}]');
-- The broker caches a looked-up user for auth.cache_ttl (5 s by default).
CREATE TABLE fluxpg.users (
    username      text PRIMARY KEY CHECK (username <> ''),
    password_hash text NOT NULL CHECK (password_hash LIKE 'scrypt$%$%$%$%$%'),
    permissions   jsonb CHECK (permissions IS NULL OR jsonb_typeof(permissions) = 'array'),
    created_at    timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE fluxpg.users IS 'Broker users and their permissions; consulted after the users of the config''s auth section (passwords only as scrypt hashes)';
COMMENT ON COLUMN fluxpg.users.username IS 'Login name (MQTT username, SASL PLAIN authcid)';
COMMENT ON COLUMN fluxpg.users.password_hash IS 'scrypt$<n>$<r>$<p>$<salt base64>$<hash base64>, as printed by `fluxpg passwd`';
COMMENT ON COLUMN fluxpg.users.permissions IS 'JSON array of {"action": "publish"|"consume"|"all", "pattern": "<queue name or topic filter>"}; NULL = every action on everything, [] = nothing';
COMMENT ON COLUMN fluxpg.users.created_at IS 'When the user was created';
