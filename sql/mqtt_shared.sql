-- MQTT shared subscriptions across nodes (migration 0004_mqtt_shared). MQTT 5 §4.8.2: a message
-- goes to ONE member of a shared group `$share/<group>/<filter>`; the nodes on one database form
-- one broker, so exactly one node must deliver it. Each node keeps this table's rows in memory
-- (refreshed on NOTIFY fluxpg_mqtt_shared) and, for every message, all nodes compute the same owner
-- node from (origin node, per-origin sequence, group, filter) over the sorted node ids listed here;
-- only the owner delivers, to one of its local members. Nothing is read on the publish path.
-- The downgrade drops the table, the trigger function and mqtt_relay.seq: exactly what this adds.

CREATE TABLE fluxpg.mqtt_shared (
    share_group text NOT NULL,
    filter      text NOT NULL,
    node_id     int NOT NULL REFERENCES fluxpg.nodes (id) ON DELETE CASCADE,
    members     int NOT NULL CHECK (members > 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (share_group, filter, node_id)
);
-- Cleaning up after a node (on its shutdown, and by node_heartbeat for a dead one) goes by node.
CREATE INDEX mqtt_shared_node ON fluxpg.mqtt_shared (node_id);
COMMENT ON TABLE fluxpg.mqtt_shared IS 'MQTT shared subscription groups per node: a row while the node has at least one member of the group (rows go with their node; changes NOTIFY fluxpg_mqtt_shared)';
COMMENT ON COLUMN fluxpg.mqtt_shared.share_group IS 'Share name: the <group> of $share/<group>/<filter>';
COMMENT ON COLUMN fluxpg.mqtt_shared.filter IS 'Topic filter of the shared subscription, without the $share/<group>/ prefix';
COMMENT ON COLUMN fluxpg.mqtt_shared.node_id IS 'fluxpg.nodes.id of a node with members of the group (deleted with the node)';
COMMENT ON COLUMN fluxpg.mqtt_shared.members IS 'How many sessions on that node are members (informational: messages are spread per node, then round robin within it)';
COMMENT ON COLUMN fluxpg.mqtt_shared.updated_at IS 'When the node last changed its row';

-- Row-level and INSERT/DELETE only: a changed member count (UPDATE) does not change which nodes
-- take part, so it wakes nobody. Identical notifications in one transaction are folded into one,
-- so removing a dead node with many rows sends one per node.
CREATE FUNCTION fluxpg.mqtt_shared_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('fluxpg_mqtt_shared',
                    (CASE WHEN TG_OP = 'DELETE' THEN OLD.node_id ELSE NEW.node_id END)::text);
  RETURN NULL;
END $$;
COMMENT ON FUNCTION fluxpg.mqtt_shared_notify() IS 'Trigger of fluxpg.mqtt_shared: NOTIFY fluxpg_mqtt_shared ''<node id>'' when a node joins or leaves a shared group, so every node reloads its copy';
CREATE TRIGGER mqtt_shared_changed AFTER INSERT OR DELETE ON fluxpg.mqtt_shared
    FOR EACH ROW EXECUTE FUNCTION fluxpg.mqtt_shared_notify();

-- The relay carries the publishing node's own message sequence, so the nodes that read a relayed
-- message pick the same shared-group owner as the publishing node did before the row existed.
ALTER TABLE fluxpg.mqtt_relay ADD COLUMN seq bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN fluxpg.mqtt_relay.seq IS 'Message number on the publishing node (per node start); with node_id it chooses which node delivers to each shared subscription group';
