-- fencing-gateway schema, version 15: membership at scale.
--
-- fencing.members_since(cluster, known_revision) (schema/functions/watch.sql): a node reads the
-- members' revision, and the members only when it moved, in the same transaction as its
-- heartbeat and without waiting for any lock, so a heartbeat costs one Postgres transaction and
-- a node's reads follow the changes, not the size of the cluster. fencing.reconcile_daemons
-- (schema/functions/daemons.sql) no longer hands a daemon straight back to a node that let an
-- assignment's acknowledge time out. fencing.refusals records who was refused: the lease the
-- resource is bound to (or the stamp-mode lease), the stamp-mode owner and the authenticated
-- client (fencing.record_refusals takes them; its earlier form stays for older gateways).
--
-- Apply with psql in one transaction together with every file of schema/functions/ in name order
-- (see the README).

ALTER TABLE fencing.refusals ADD COLUMN IF NOT EXISTS lease_key text;
ALTER TABLE fencing.refusals ADD COLUMN IF NOT EXISTS owner text;
ALTER TABLE fencing.refusals ADD COLUMN IF NOT EXISTS caller text;

INSERT INTO fencing.schema_migrations (version, name) VALUES (15, 'members_at_scale')
ON CONFLICT (version) DO NOTHING;
