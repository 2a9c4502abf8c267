-- Grants: time-bounded read leases on a fence (schema version 5).
--
-- A gateway that asks fencing.gate for a grant may admit writes of the resource's current term
-- without asking again until fences.granted_until (its own deadline is earlier: the time it
-- asked plus the remaining time reported, minus a margin, on its monotonic clock). Every way a
-- fence can move (a higher term through a gateway, the SQL guard or fencing.admit, an admin
-- advance, reset, bind or rebind) first waits, holding the fence row, until that time has
-- passed; holding the row stops every renewal of the grant meanwhile. A bound resource's grant
-- never outlasts its lease's expiry, and a new term of the lease waits for the grants of the
-- old term (fencing.lease_grants_end): a lease released early keeps its grants' end.

-- Refuses a null, negative or overlong grant with SQLSTATE 22023.
CREATE OR REPLACE FUNCTION fencing.check_grant(grant_ interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF grant_ IS NULL OR grant_ < interval '0' OR grant_ > interval '1 minute' THEN
        RAISE EXCEPTION 'fencing: a grant must be between 0 and 00:01:00, got %', coalesce(grant_::text, 'null')
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- How long from now_ a gateway that asked for a grant (grant_for > 0) may use the one recorded on
-- a fence version: until the grant's end, but never past the horizon minus the caller's forward
-- timeout (so every write admitted under it has a deadline the horizon covers). Not asked for, no
-- grant recorded, or no horizon: 0 (least() would skip the NULL and hand out a grant nobody
-- recorded, that no raise would wait for).
DROP FUNCTION IF EXISTS fencing.grant_left(timestamptz, timestamptz, interval, timestamptz);
CREATE OR REPLACE FUNCTION fencing.grant_left(grant_for interval, granted_until timestamptz, horizon timestamptz,
                                              forward_timeout interval, now_ timestamptz)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN coalesce(grant_for, interval '0') <= interval '0' OR granted_until IS NULL OR horizon IS NULL THEN 0
                ELSE fencing.remaining_ms(least(granted_until, horizon - forward_timeout), now_) END
$$;

-- True while a grant ending at until_ may still be in use.
CREATE OR REPLACE FUNCTION fencing.grant_outstanding(until_ timestamptz) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT coalesce(until_ > clock_timestamp(), false)
$$;

-- Waits until a grant ending at until_ has ended. The caller holds the fence row FOR UPDATE,
-- so nobody can renew the grant meanwhile; a grant lasts at most a minute, and the session's
-- statement_timeout bounds the wait too.
CREATE OR REPLACE FUNCTION fencing.await_grant(until_ timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    WHILE fencing.grant_outstanding(until_) LOOP
        PERFORM pg_sleep(least(60, extract(epoch FROM (until_ - clock_timestamp()))) + 0.001);
    END LOOP;
END
$$;

-- When the last grant on the resources bound to lease_'s key, at its current term, ends.
-- The caller holds the lease row FOR UPDATE, so every gateway transaction that granted while it
-- read the lease (FOR KEY SHARE) has committed, and at READ COMMITTED this statement's snapshot
-- sees them all. At other isolation levels the snapshot may predate a grant, and no bound is
-- safe without it (a renewal with a shorter ttl moves the expiry back below grants already
-- given): a new term, a release and a forced release are refused there (SQLSTATE 0A000).
CREATE OR REPLACE FUNCTION fencing.lease_grants_end(lease_ fencing.leases) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'fencing: ending a leadership period or starting a new one decides at READ COMMITTED only, not at % (grants on its resources may be newer than this snapshot)',
            current_setting('transaction_isolation')
            USING ERRCODE = '0A000';
    END IF;
    RETURN greatest(lease_.grants_until,
                    (SELECT max(f.granted_until) FROM fencing.fences f WHERE f.lease_key = lease_.key));
END
$$;
