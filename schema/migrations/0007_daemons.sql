-- fencing-gateway schema, version 7: daemons, background work units the leader of a cluster
-- assigns to its live nodes.
--
-- A node offers the daemons it can run (fencing.nodes.daemons). The leader of the cluster keeps
-- one row per daemon in fencing.daemons and moves each through its assignment's lifecycle:
-- assigning (the leader picked a node), active (the node acknowledged and runs it), revoking
-- (the leader asked it back; the node drains it), then deleted (the assignment ended; the row
-- is 'unassigned' until the next assignment). Every change the leader makes carries its term and
-- is admitted through the fence of the resource 'fencing.daemons/<cluster>', bound to the
-- leader's lease: a leader that lost its lease changes nothing. Each assignment has a new
-- generation, the daemon's own fencing token.

ALTER TABLE fencing.nodes ADD COLUMN IF NOT EXISTS daemons text[] NOT NULL DEFAULT '{}';
COMMENT ON COLUMN fencing.nodes.daemons IS
    'The daemons this incarnation of the node offers to run (emptied when the node joins anew).';

CREATE TABLE IF NOT EXISTS fencing.daemons (
    cluster         text        NOT NULL,
    daemon          text        NOT NULL,
    state           text        NOT NULL
                    CHECK (state IN ('unassigned', 'assigning', 'active', 'revoking')),
    -- The number of the current (or last) assignment: the daemon's fencing token.
    generation      bigint      NOT NULL DEFAULT 0,
    -- The node incarnation it is assigned to: the node id and that incarnation's started_at.
    node_id         text,
    node_started_at timestamptz,
    -- The term of the leader that made the last change to the assignment.
    term            bigint      NOT NULL,
    -- Why the last assignment ended or is being revoked.
    reason          text,
    -- The node the last assignment timed out on: the next one goes elsewhere if it can.
    avoid_node      text,
    -- Since when the daemon waits for a node (for the time to assign).
    waiting_since   timestamptz,
    -- The acknowledge deadline (assigning) or the drain deadline (revoking; set when the node
    -- first reads the revocation, to then + drain_for: a node that never heard of it is not
    -- forced, it keeps the daemon until it expires).
    deadline        timestamptz,
    drain_for       interval,
    changed_at      timestamptz NOT NULL,
    PRIMARY KEY (cluster, daemon),
    CHECK ((state = 'unassigned') = (node_id IS NULL)),
    CHECK ((node_id IS NULL) = (node_started_at IS NULL))
);

COMMENT ON TABLE fencing.daemons IS
    'One row per daemon of a cluster: its current assignment, changed by the leader through the fence.';

-- Generations come from one sequence: a daemon's token only grows, even across a row removed
-- (no live node offered it) and created again.
CREATE SEQUENCE IF NOT EXISTS fencing.daemon_generations;

-- Every step of every assignment, on the store's clock: what the tests and an operator read
-- to see where a daemon ran and when.
CREATE TABLE IF NOT EXISTS fencing.daemon_history (
    id         bigserial   PRIMARY KEY,
    cluster    text        NOT NULL,
    daemon     text        NOT NULL,
    generation bigint      NOT NULL,
    node_id    text        NOT NULL,
    -- assigning | active | revoking | deleted
    state      text        NOT NULL,
    reason     text,
    term       bigint      NOT NULL,
    at         timestamptz NOT NULL
);

CREATE INDEX IF NOT EXISTS daemon_history_cluster_at ON fencing.daemon_history (cluster, at);

INSERT INTO fencing.schema_migrations (version, name) VALUES (7, 'daemons')
ON CONFLICT (version) DO NOTHING;
