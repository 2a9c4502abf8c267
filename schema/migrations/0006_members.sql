-- fencing-gateway schema, version 6: cluster membership.
--
-- One row per node of a cluster: a process that heartbeats. A node is live while expires_at
-- is in the future by this database's clock. Rows are kept after a node leaves (so a node id
-- that comes back is a new incarnation with a new started_at), and removed a day after they
-- expired by the next heartbeat in their cluster.

CREATE TABLE IF NOT EXISTS fencing.nodes (
    cluster      text        NOT NULL,
    node_id      text        NOT NULL,
    -- Which process holds the node id: one id is never live in two processes at once.
    incarnation  text        NOT NULL,
    name         text        NOT NULL,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    metadata     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (cluster, node_id)
);

COMMENT ON TABLE fencing.nodes IS
    'One row per node of a cluster; live while expires_at is in the future by the database clock.';
COMMENT ON COLUMN fencing.nodes.started_at IS
    'When this incarnation of the node joined: a node that expired and came back has a new one.';

INSERT INTO fencing.schema_migrations (version, name) VALUES (6, 'members')
ON CONFLICT (version) DO NOTHING;
