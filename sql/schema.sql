-- fluxpg schema: tables and types (DESIGN §2). Installed by migration 0001.
-- Functions live in functions.sql, views in views.sql; both are CREATE OR REPLACE so a later
-- migration can re-run them.

CREATE SCHEMA IF NOT EXISTS fluxpg;
COMMENT ON SCHEMA fluxpg IS 'fluxpg message broker: queue log, consumer groups, pending lists (see DESIGN.md)';

CREATE TABLE fluxpg.queues (
    id           serial PRIMARY KEY,
    name         text NOT NULL UNIQUE,
    kind         text NOT NULL CHECK (kind IN ('classic', 'stream')),
    topics       text[] NOT NULL,
    partitions   int NOT NULL DEFAULT 1 CHECK (partitions BETWEEN 1 AND 1024),
    segment_size bigint NOT NULL DEFAULT 100000 CHECK (segment_size > 0),
    settings     jsonb NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE fluxpg.queues IS 'One row per durable (classic) or stream queue; create or update with fluxpg.declare_queue()';
COMMENT ON COLUMN fluxpg.queues.name IS 'Queue name: the <name> of $queue/<name>/...; dead-letter queues are named $dlq/<queue>';
COMMENT ON COLUMN fluxpg.queues.kind IS 'classic (work queue: pending list, ack removes) or stream (append-only log, ack checkpoints)';
COMMENT ON COLUMN fluxpg.queues.topics IS 'MQTT topic filters that route publishes into this queue (default $queue/<name>/#)';
COMMENT ON COLUMN fluxpg.queues.partitions IS 'Number of log partitions (stream queues may have more than one)';
COMMENT ON COLUMN fluxpg.queues.segment_size IS 'Messages per log segment (child table); retention drops whole segments';
COMMENT ON COLUMN fluxpg.queues.settings IS 'The queue''s config keys as JSON (limits, retry, dlq, retention, delivery, primary_group), defaults filled in';

CREATE TABLE fluxpg.heads (
    queue_id    int NOT NULL REFERENCES fluxpg.queues (id) ON DELETE CASCADE,
    partition   int NOT NULL,
    next_seq    bigint NOT NULL DEFAULT 0,
    first_seq   bigint NOT NULL DEFAULT 0,
    segment_end bigint NOT NULL DEFAULT 0,
    rr          bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue_id, partition)
) WITH (fillfactor = 50);
COMMENT ON TABLE fluxpg.heads IS 'One row per queue partition; its row lock serialises appends so they commit in seq order';
COMMENT ON COLUMN fluxpg.heads.next_seq IS 'The offset the next appended message gets (= number of messages ever appended)';
COMMENT ON COLUMN fluxpg.heads.first_seq IS 'Lowest offset still retained (segments below it were dropped by retention)';
COMMENT ON COLUMN fluxpg.heads.segment_end IS 'Exclusive upper offset bound of the newest created segment';

CREATE TABLE fluxpg.log (
    queue_id   int NOT NULL,
    partition  int NOT NULL,
    seq        bigint NOT NULL,
    topic      text NOT NULL,
    payload    bytea NOT NULL,
    headers    jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    PRIMARY KEY (queue_id, partition, seq)
) PARTITION BY LIST (queue_id);
COMMENT ON TABLE fluxpg.log IS 'The append-only message log: LIST partitioned by queue, each queue RANGE partitioned by (partition, seq) into segments. Never UPDATEd or DELETEd; retention drops segments';
COMMENT ON COLUMN fluxpg.log.seq IS 'The message offset within its queue partition (on the wire: offset; message-id is <queue>:<seq>)';
COMMENT ON COLUMN fluxpg.log.topic IS 'The topic it was published to, e.g. $queue/orders/eu/images';
COMMENT ON COLUMN fluxpg.log.headers IS 'Protocol properties and headers (user properties, AMQP properties) as JSON';
COMMENT ON COLUMN fluxpg.log.expires_at IS 'created_at + the queue''s message_ttl; NULL when message_ttl is 0. Expired messages are never delivered';

CREATE TABLE fluxpg.groups (
    id             serial PRIMARY KEY,
    queue_id       int NOT NULL REFERENCES fluxpg.queues (id) ON DELETE CASCADE,
    name           text NOT NULL,
    mode           text NOT NULL CHECK (mode IN ('classic', 'stream')),
    filter         text,
    filter_regex   text,
    auto_commit    boolean NOT NULL DEFAULT true,
    created_at     timestamptz NOT NULL DEFAULT now(),
    last_active_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (queue_id, name)
);
COMMENT ON TABLE fluxpg.groups IS 'Consumer groups of a queue: internal name <group> or <group>@<filter>; created on first use';
COMMENT ON COLUMN fluxpg.groups.filter IS 'Routing-key filter (MQTT wildcards) from the part of the name after @; applied at delivery';
COMMENT ON COLUMN fluxpg.groups.filter_regex IS 'The filter compiled to an anchored regular expression over the routing key';
COMMENT ON COLUMN fluxpg.groups.auto_commit IS 'Stream groups: commit the cursor automatically every auto_commit_interval';

CREATE TABLE fluxpg.cursors (
    group_id       int NOT NULL REFERENCES fluxpg.groups (id) ON DELETE CASCADE,
    partition      int NOT NULL,
    cursor         bigint NOT NULL,
    committed      bigint NOT NULL,
    owner          text,
    owner_seen_at  timestamptz,
    last_commit_at timestamptz,
    PRIMARY KEY (group_id, partition)
) WITH (fillfactor = 50);
COMMENT ON TABLE fluxpg.cursors IS 'Progress of a group in one queue partition; its row lock makes each batch go to one consumer';
COMMENT ON COLUMN fluxpg.cursors.cursor IS 'Next offset to deliver (read position)';
COMMENT ON COLUMN fluxpg.cursors.committed IS 'Stream groups: checkpoint, the first offset not yet processed. Classic groups derive committed from the pending list (see group_status)';
COMMENT ON COLUMN fluxpg.cursors.owner IS 'Partitioned streams: the member the partition is assigned to';

CREATE TABLE fluxpg.pending (
    group_id       int NOT NULL,
    partition      int NOT NULL,
    seq            bigint NOT NULL,
    consumer       text NOT NULL,
    delivered_at   timestamptz NOT NULL DEFAULT now(),
    delivery_count int NOT NULL DEFAULT 1,
    visible_at     timestamptz NOT NULL,
    PRIMARY KEY (group_id, partition, seq)
);
CREATE INDEX pending_due ON fluxpg.pending (group_id, visible_at);
COMMENT ON TABLE fluxpg.pending IS 'Pending entry list (PEL) of classic groups: delivered, not yet acknowledged messages';
COMMENT ON COLUMN fluxpg.pending.consumer IS 'Consumer the message was last delivered to';
COMMENT ON COLUMN fluxpg.pending.delivery_count IS 'How many times it was delivered; more than 1 + retry.max_retries dead-letters it';
COMMENT ON COLUMN fluxpg.pending.visible_at IS 'When it may be delivered again: visibility timeout after delivery, or retry backoff after a nack';

CREATE TABLE fluxpg.nodes (
    id           serial PRIMARY KEY,
    host         text NOT NULL,
    pid          int NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE fluxpg.nodes IS 'Running broker processes sharing this database, with their heartbeat';

CREATE TABLE fluxpg.members (
    group_id     int NOT NULL REFERENCES fluxpg.groups (id) ON DELETE CASCADE,
    name         text NOT NULL,
    node_id      int REFERENCES fluxpg.nodes (id) ON DELETE SET NULL,
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, name)
);
COMMENT ON COLUMN fluxpg.nodes.host IS 'Host name of the machine the node runs on';
COMMENT ON COLUMN fluxpg.nodes.pid IS 'Process id of the node on its host';
COMMENT ON COLUMN fluxpg.nodes.last_seen_at IS 'Last heartbeat; a node silent for heartbeat_timeout is removed by the others and its consumers'' pending entries released';
COMMENT ON COLUMN fluxpg.members.name IS 'Consumer name (MQTT client id, AMQP consumer tag, …) as given to claim/read';
COMMENT ON COLUMN fluxpg.members.node_id IS 'Node the consumer is connected to (NULL when it used SQL directly)';
COMMENT ON COLUMN fluxpg.members.last_seen_at IS 'Last claim/read/heartbeat; partitioned stream members silent for delivery.member_timeout leave the group';
COMMENT ON TABLE fluxpg.members IS 'Consumers known to a group, with the node they are connected to and when they were last seen';

CREATE TYPE fluxpg.delivery AS (
    queue          text,
    grp            text,
    partition      int,
    seq            bigint,
    topic          text,
    payload        bytea,
    headers        jsonb,
    created_at     timestamptz,
    delivery_count int,
    message_id     text
);
COMMENT ON TYPE fluxpg.delivery IS 'A message handed to a consumer by fluxpg.claim / fluxpg.read / fluxpg.claim_stale';
