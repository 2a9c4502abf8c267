-- fencing-gateway schema, version 9: grants scoped to a lease (lease grants).
--
-- A bound resource admits only its lease's current term, so one grant per (lease, term) can cover
-- every resource bound to that lease: a gateway that holds a grant given on any of the lease's
-- resources at term t admits, without asking, writes of term t to every resource of that lease it
-- has had one admitted decision for at term t (its creation or raise, its binding, its settle).
-- The grant is recorded as before on the fence row it was given on, so a new term of the lease
-- (fencing.lease_grant_ms) waits it out as before. What is new:
--   - leases.fence_epoch: bumped by every operator's change of a fence bound to the lease
--     (advance_fence, rebind), in the same transaction. A gateway counts a decision of a resource
--     for a lease grant only at the epoch both were given at, so no decision made before such a
--     change counts for a grant given after it;
--   - gate_result.lease_epoch: the epoch a decision was made at (NULL for an unbound fence and for
--     a refusal);
--   - those admin actions wait out every grant on the lease's resources at the fence's term, not
--     only the fence's own (fencing.await_admin_grants).
--
-- Apply with psql in one transaction together with every file of schema/functions/ in name order
-- (see the README).

ALTER TABLE fencing.leases ADD COLUMN IF NOT EXISTS fence_epoch bigint NOT NULL DEFAULT 0;

COMMENT ON COLUMN fencing.leases.fence_epoch IS
    'Bumped by every admin change of a fence bound to this lease: decisions before it count for no lease grant after it.';

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
