-- fencing-gateway schema, version 13: watch (revisions and wake-ups).
--
-- Every change of a lease or of a cluster's members gets a revision, so a watcher that read a
-- state at revision r can ask "anything since r?" and be answered at once if so, and otherwise
-- wait for a change (GET /v1/leases/{key}?wait=30s&after=r; fencing_election::watch):
--   - fencing.leases.revision: grows by one with each change of the row a reader can see (a new
--     term or holder, a value, a release or force-release, a lease that was ended and is held
--     again); a renewal is no change. The revision a watcher sees (fencing.observe_lease) is
--     2 * revision, plus 1 once the lease has ended by the store's clock: an expiry, which
--     writes nothing, is a change too;
--   - fencing.clusters.revision: grows with each join, leave, change of a node's name, metadata
--     or incarnation; the members' revision a watcher sees (fencing.nodes_revision) is it plus
--     the cluster's nodes that ran out without a leave (fencing.nodes.gone: it left), so it
--     moves when a node runs out, though nothing is written then;
--   - each change notifies channel fencing_watch with 'lease:<key>' or 'nodes:<cluster>' when
--     it commits, to wake watchers at once on every gateway (polling stays the fallback).
-- The triggers that keep the revisions are made by schema/functions/watch.sql.
--
-- Apply with psql in one transaction together with every file of schema/functions/ in name order
-- (see the README).

ALTER TABLE fencing.leases ADD COLUMN IF NOT EXISTS revision bigint NOT NULL DEFAULT 1;

CREATE TABLE IF NOT EXISTS fencing.clusters (
    cluster  text   PRIMARY KEY,
    revision bigint NOT NULL DEFAULT 0 CHECK (revision >= 0)
);

ALTER TABLE fencing.nodes ADD COLUMN IF NOT EXISTS gone boolean NOT NULL DEFAULT false;
UPDATE fencing.nodes n SET gone = true WHERE n.expires_at <= clock_timestamp() AND NOT n.gone;
INSERT INTO fencing.clusters (cluster, revision)
SELECT DISTINCT n.cluster, 1 FROM fencing.nodes n
ON CONFLICT (cluster) DO NOTHING;

COMMENT ON COLUMN fencing.leases.revision IS
    'Grows by one with each change a reader can see (not a renewal); watchers see 2 * revision + 1 once the lease ended.';
COMMENT ON TABLE fencing.clusters IS
    'One row per cluster: revision grows with each join, leave or change of its nodes (fencing.node_changed).';
COMMENT ON COLUMN fencing.nodes.gone IS
    'The node left (fencing.leave, or ran out before version 13): its end is counted in its cluster''s revision.';

INSERT INTO fencing.schema_migrations (version, name) VALUES (13, 'watch')
ON CONFLICT (version) DO NOTHING;
