-- fencing-gateway schema, version 14: graceful handover.
--
-- An operator, or a node, asks the holder of a lease to step down (fencing.request_resign,
-- audited), optionally naming the owner that should lead next. The holder learns of it from
-- its next renewal (lease_result.resign_requested) or its watch (the lease's revision moves),
-- stops its leader work, drains and releases; the release is recorded in fencing.lease_history
-- as 'handed_over'. A named successor then has the lease to itself for a while: until it
-- acquires, or least(the last period's ttl, 10 s) after the release, every other owner's
-- acquire is refused as if the successor held it. A holder that ignores the request is not
-- forced; the caller may force_release after a timeout of its choosing.
--
-- Apply with psql in one transaction together with every file of schema/functions/ in name order
-- (see the README).

ALTER TABLE fencing.leases ADD COLUMN IF NOT EXISTS resign_term bigint NULL;
ALTER TABLE fencing.leases ADD COLUMN IF NOT EXISTS resign_successor text NULL;
ALTER TABLE fencing.leases ADD COLUMN IF NOT EXISTS resign_requested_at timestamptz NULL;
ALTER TABLE fencing.leases ADD COLUMN IF NOT EXISTS reserved_for text NULL;
ALTER TABLE fencing.leases ADD COLUMN IF NOT EXISTS reserved_until timestamptz NULL;

COMMENT ON COLUMN fencing.leases.resign_term IS
    'The term a handover was requested of (fencing.request_resign): a request of another term than the lease''s is none.';
COMMENT ON COLUMN fencing.leases.reserved_for IS
    'After a handover to a named successor: until reserved_until, only that owner may start the next term.';

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                    WHERE attrelid = 'fencing.lease_result'::regclass AND attname = 'resign_requested' AND NOT attisdropped) THEN
        ALTER TYPE fencing.lease_result ADD ATTRIBUTE resign_requested boolean;
    END IF;
    -- fencing.observe_lease gains columns (the request, the successor): version 13's cannot be
    -- replaced in place, so it is dropped here and made again by its function file.
    IF to_regprocedure('fencing.observe_lease(text)') IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pg_proc p
                        WHERE p.oid = to_regprocedure('fencing.observe_lease(text)')
                          AND 'successor' = ANY (p.proargnames)) THEN
        DROP FUNCTION fencing.observe_lease(text);
    END IF;
END
$$;

INSERT INTO fencing.schema_migrations (version, name) VALUES (14, 'handover')
ON CONFLICT (version) DO NOTHING;
