-- Client connections of every broker node (migration 0008_connections), for the console: each node
-- reports its live connections here a few seconds after they change (fluxpg.report_connections);
-- a node's rows go with its fluxpg.nodes row. UNLOGGED: it describes running processes only, and
-- a crash of PostgreSQL ends those connections anyway.
CREATE UNLOGGED TABLE fluxpg.connections (
    node_id   int NOT NULL REFERENCES fluxpg.nodes (id) ON DELETE CASCADE,
    id        bigint NOT NULL,
    protocol  text NOT NULL,
    listener  text NOT NULL,
    peer      text NOT NULL,
    client_id text,
    username  text,
    since     timestamptz NOT NULL,
    PRIMARY KEY (node_id, id)
);
COMMENT ON TABLE fluxpg.connections IS 'Live client connections of every broker node as last reported by the node (a few seconds behind); the console lists and closes them';
COMMENT ON COLUMN fluxpg.connections.id IS 'The connection''s number within its node (what the console''s close asks the node to close)';
COMMENT ON COLUMN fluxpg.connections.client_id IS 'MQTT client id (NULL for protocols without one)';
COMMENT ON COLUMN fluxpg.connections.username IS 'The user it logged in as (NULL: anonymous or auth off)';
