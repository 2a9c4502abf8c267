-- fencing-gateway schema, version 5: grants, time-bounded read leases on a fence.
--
-- A gateway that holds a grant on a resource admits writes of the resource's current term
-- without a round trip, until its own deadline (the time the grant was asked for plus the
-- remaining time this database reported, minus a margin, on its monotonic clock). So that
-- S3-S5 hold exactly as without grants, no higher term is admitted for the resource, no lease
-- term change starts for a bound lease and no admin action moves the fence until every grant
-- on the old term has ended: those wait for fences.granted_until and leases.grants_until.
--
-- Apply with psql in one transaction together with every file of schema/functions/ in name order
-- (see the README): this file drops the gateway's decision functions, which those files create
-- again with their new signatures.

ALTER TABLE fencing.fences ADD COLUMN IF NOT EXISTS granted_until timestamptz NULL;
ALTER TABLE fencing.leases ADD COLUMN IF NOT EXISTS grants_until timestamptz NULL;

COMMENT ON COLUMN fencing.fences.granted_until IS
    'Gateways may admit writes of max_term without asking until this time (a grant); no term change before it.';
COMMENT ON COLUMN fencing.leases.grants_until IS
    'No grant on a resource bound to this lease at its current term lasts beyond this time; no new term before it.';

-- fencing.lease_grants_end reads the grants on a lease's resources.
CREATE INDEX IF NOT EXISTS fences_lease_key ON fencing.fences (lease_key) WHERE lease_key IS NOT NULL;

-- The remaining time of the grant a decision carries (0: none).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                    WHERE attrelid = 'fencing.gate_result'::regclass AND attname = 'grant_ms' AND NOT attisdropped) THEN
        ALTER TYPE fencing.gate_result ADD ATTRIBUTE grant_ms bigint;
    END IF;
END
$$;

-- The signatures that gain a grant argument: the new ones are in schema/functions/.
-- Guarded, so a fresh install (where they never existed) prints no NOTICE.
DO $$
BEGIN
    IF to_regprocedure('fencing.gate_many(text[], bigint[], text[], text[], text[], interval)') IS NOT NULL THEN
        DROP FUNCTION fencing.gate_many(text[], bigint[], text[], text[], text[], interval);
    END IF;
    IF to_regprocedure('fencing.gate_lease(text, text, text, interval, text)') IS NOT NULL THEN
        DROP FUNCTION fencing.gate_lease(text, text, text, interval, text);
    END IF;
    IF to_regprocedure('fencing.gate(text, bigint, interval, text)') IS NOT NULL THEN
        DROP FUNCTION fencing.gate(text, bigint, interval, text);
    END IF;
END
$$;

INSERT INTO fencing.schema_migrations (version, name) VALUES (5, 'grants')
ON CONFLICT (version) DO NOTHING;
