-- fencing-gateway schema, version 9: grants scoped to a lease (lease grants).
--
-- A bound resource admits only its lease's current term, so one grant per (lease, term) can cover
-- every resource bound to that lease: a gateway that holds a grant given on any of the lease's
-- resources at term t admits, without asking, writes of term t to every resource of that lease it
-- has had one admitted decision for at term t (its creation or raise, its binding, its settle).
-- The grant is recorded as before on the fence row it was given on, so a new term of the lease
-- (fencing.lease_grant_ms) waits it out as before. What is new:
--   - fencing.lease_epochs: per lease key, the fence epoch, bumped by every operator's change of
--     a fence bound to the lease (advance_fence, rebind), in the same transaction (a row of its
--     own, not a column of the lease row, so that the change never holds up the lease's
--     renewals). A gateway counts a decision of a resource for a lease grant only at the epoch
--     both were given at, so no decision made before such a change counts for a grant given
--     after it;
--   - gate_result.lease_epoch: the epoch a decision was made at (NULL for an unbound fence and for
--     a refusal);
--   - those admin actions wait out every grant on the lease's resources at the fence's term, not
--     only the fence's own (fencing.await_admin_grants).
--
-- Apply with psql in one transaction together with every file of schema/functions/ in name order
-- (see the README).

CREATE TABLE IF NOT EXISTS fencing.lease_epochs (
    key   text PRIMARY KEY,
    epoch bigint NOT NULL CHECK (epoch >= 0)
);

COMMENT ON TABLE fencing.lease_epochs IS
    'Per lease key, bumped by every admin change of a fence bound to it: decisions before it count for no lease grant after it (no row: 0).';

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                    WHERE attrelid = 'fencing.gate_result'::regclass AND attname = 'lease_epoch' AND NOT attisdropped) THEN
        ALTER TYPE fencing.gate_result ADD ATTRIBUTE lease_epoch bigint;
    END IF;
END
$$;

INSERT INTO fencing.schema_migrations (version, name) VALUES (9, 'lease_grants')
ON CONFLICT (version) DO NOTHING;
