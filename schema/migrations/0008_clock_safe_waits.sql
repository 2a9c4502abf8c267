-- fencing-gateway schema, version 8: waits measured as lengths of time, never as instants of the
-- wall clock.
--
-- Versions 2 and 5 kept instants of this database's wall clock on the fence and lease rows (a
-- horizon, settle_at, granted_until, grants_until) and compared them with clock_timestamp():
-- a step of that clock turned a timestamp into permission to admit or forward (a forward step
-- ended every grant and settle wait at once; a backward step lengthened them by the step). From
-- this version on, a row records lengths, and every wait is a length of real time:
--   - fences.forward_ms: the longest forward timeout of the gateway writes admitted at max_term;
--   - fences.grant_ms: the longest grant given at max_term;
--   - fences.settle_ms: how long a gateway write of max_term waits, counted from its own decision,
--     before it is forwarded (lower-term writes may still be on their way); NULL once a gateway
--     has seen that length pass since a decision at max_term (fencing.mark_settled);
--   - fences.drain_ms: the settle_ms that max_term's decisions made before the settle was marked
--     over still wait; their writes may be forwarded until drain_ms plus forward_ms after the
--     mark. NULL once a gateway has seen that pass (fencing.mark_drained). A term change
--     settles behind forward_ms plus settle_ms or, once settled, drain_ms;
--   - leases.grants_ended_term: every grant at this term or below on the lease's resources has
--     ended (a new term waited for them).
-- A term change holding the fence row sleeps grant_ms in counted slices (fencing.sleep_ms), and
-- a new term of a lease sleeps the longest grant on its resources, holding the lease row.
--
-- Apply with psql in one transaction together with every file of schema/functions/ in name order
-- (see the README): this file drops the functions that compared instants.

ALTER TABLE fencing.fences ADD COLUMN IF NOT EXISTS forward_ms bigint NULL;
ALTER TABLE fencing.fences ADD COLUMN IF NOT EXISTS grant_ms bigint NULL;
ALTER TABLE fencing.fences ADD COLUMN IF NOT EXISTS settle_ms bigint NULL;
ALTER TABLE fencing.fences ADD COLUMN IF NOT EXISTS drain_ms bigint NULL;
ALTER TABLE fencing.leases ADD COLUMN IF NOT EXISTS grants_ended_term bigint NULL;

-- Carry what the instants said as lengths counted from now (the one read of the wall clock this
-- version makes to decide anything): current-term writes may be in flight until the horizon,
-- current-term writes must settle until settle_at, a grant may be held until granted_until.
-- Counted from now, each covers what its instant covered: the next term change is later.
UPDATE fencing.fences f
   SET forward_ms = nullif(fencing.remaining_ms(f.horizon, clock_timestamp()), 0),
       settle_ms = nullif(fencing.remaining_ms(f.settle_at, clock_timestamp()), 0),
       grant_ms = nullif(fencing.remaining_ms(f.granted_until, clock_timestamp()), 0)
 WHERE f.horizon IS NOT NULL OR f.granted_until IS NOT NULL OR f.settle_at IS NOT NULL;

-- The functions that read the instants, and the instants themselves.
-- Guarded, so a fresh install (where they never existed) prints no NOTICE.
DO $$
BEGIN
    IF to_regprocedure('fencing.grant_left(interval, timestamptz, timestamptz, interval, timestamptz)') IS NOT NULL THEN
        DROP FUNCTION fencing.grant_left(interval, timestamptz, timestamptz, interval, timestamptz);
    END IF;
    IF to_regprocedure('fencing.grant_outstanding(timestamptz)') IS NOT NULL THEN
        DROP FUNCTION fencing.grant_outstanding(timestamptz);
    END IF;
    IF to_regprocedure('fencing.await_grant(timestamptz)') IS NOT NULL THEN
        DROP FUNCTION fencing.await_grant(timestamptz);
    END IF;
    IF to_regprocedure('fencing.lease_grants_end(fencing.leases)') IS NOT NULL THEN
        DROP FUNCTION fencing.lease_grants_end(fencing.leases);
    END IF;
END
$$;
ALTER TABLE fencing.fences DROP COLUMN IF EXISTS horizon;
ALTER TABLE fencing.fences DROP COLUMN IF EXISTS settle_at;
ALTER TABLE fencing.fences DROP COLUMN IF EXISTS granted_until;
ALTER TABLE fencing.leases DROP COLUMN IF EXISTS grants_until;

COMMENT ON COLUMN fencing.fences.forward_ms IS
    'The longest forward timeout (ms) of the gateway writes admitted at max_term; NULL: none yet.';
COMMENT ON COLUMN fencing.fences.grant_ms IS
    'The longest grant (ms) given at max_term: a term change waits this long, holding the row; NULL: none.';
COMMENT ON COLUMN fencing.fences.settle_ms IS
    'Gateway writes of max_term wait this long (ms) from their decision before they are forwarded; NULL: settled.';
COMMENT ON COLUMN fencing.fences.drain_ms IS
    'The settle (ms) that writes of max_term decided before it was marked over still wait; NULL: drained.';
COMMENT ON COLUMN fencing.leases.grants_ended_term IS
    'Every grant on this lease''s resources at this term or below has ended (a new term waited for them).';

INSERT INTO fencing.schema_migrations (version, name) VALUES (8, 'clock_safe_waits')
ON CONFLICT (version) DO NOTHING;
