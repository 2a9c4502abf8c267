-- Grants and settle waits, measured as lengths of real time (schema versions 5 and 8).
--
-- A gateway that asks fencing.gate for a grant may admit writes of the resource's current term
-- without asking again for the length it was given (its own deadline is shorter: counted from
-- before it asked, on its monotonic clock, less a clock-rate allowance and a margin). The fence
-- row records the longest grant given at its term (grant_ms). Every way a fence can move (a
-- higher term through a gateway, the SQL guard or fencing.admit, an admin advance, reset, bind or
-- rebind) first takes the row FOR UPDATE, which stops every renewal (a renewal writes the row),
-- and then sleeps grant_ms: every grant given before the lock has ended by then, whatever the
-- wall clock did. A new term of a lease sleeps the longest grant on its bound resources, holding
-- the lease row and the lease's advisory lock (every bound grant is given holding that lock
-- shared).
--
-- Nothing here compares an instant of the wall clock with another: a step of this database's
-- clock changes no wait (only a backward step can lengthen the slice of a sleep it falls in).

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

-- Sleeps at least ms milliseconds of real time. pg_sleep's timer is the kernel's, so it sleeps
-- its whole length across a step of the wall clock; but after a wake-up before its end (an
-- interrupt) it measures what is left on the wall clock. So the sleep goes in counted slices of
-- 10 ms, plus one: a forward step can cut short only the slice it falls in.
CREATE OR REPLACE FUNCTION fencing.sleep_ms(ms bigint) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF coalesce(ms, 0) <= 0 THEN
        RETURN;
    END IF;
    FOR n IN 0..ceil(ms / 10.0)::bigint LOOP
        PERFORM pg_sleep(0.010);
    END LOOP;
END
$$;

-- The advisory locks that order grants before term changes without writing a row: a grant that
-- records nothing new is given holding the fence's (and a bound fence's lease's) lock shared, and
-- every term change takes them exclusively, holding the row, before it sleeps out the grants. Two
-- class ids of their own; a collision of the hashes only makes a decision wait or skip a grant.
CREATE OR REPLACE FUNCTION fencing.fence_lock_id(resource text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtext('fencing.fences/' || resource) $$;
CREATE OR REPLACE FUNCTION fencing.lease_lock_id(key text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtext('fencing.leases/' || key) $$;

-- Waits until every grant at fence_'s term has ended: the caller holds the row FOR UPDATE, so no
-- grant is recorded meanwhile, and the fence's advisory lock (taken here, exclusively, after every
-- grant given under it shared has committed) stops the grants that record nothing; each given
-- before lasts at most grant_ms. A bound fence's grants at a term its lease has left behind were
-- waited for by the lease's new term.
CREATE OR REPLACE FUNCTION fencing.await_grants(fence_ fencing.fences) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF coalesce(fence_.grant_ms, 0) <= 0 THEN
        RETURN;
    END IF;
    IF fence_.lease_key IS NOT NULL AND EXISTS (
        SELECT 1 FROM fencing.leases l
         WHERE l.key = fence_.lease_key AND l.grants_ended_term >= fence_.max_term) THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(1718183525, fencing.fence_lock_id(fence_.resource));
    PERFORM fencing.sleep_ms(fence_.grant_ms);
END
$$;

-- How long the gateway writes of the next term (or binding) of fence_ settle: the writes of its
-- current term may be forwarded for up to forward_ms after their decision, and those decided
-- while it settled itself wait settle_ms first; once its settle was marked over, those decided
-- before the mark may still be waiting drain_ms (until a gateway marks them drained). NULL when
-- no gateway wrote at that term.
CREATE OR REPLACE FUNCTION fencing.next_settle(fence_ fencing.fences) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT nullif(coalesce(fence_.forward_ms, 0) + coalesce(fence_.settle_ms, fence_.drain_ms, 0), 0)
$$;

-- The longest grant given on the resources bound to lease_'s key at its current term, unless a
-- new term already waited for them. This takes the lease's advisory lock exclusively (the caller
-- holds it already, or the lease row FOR UPDATE, or both), so every gateway transaction that
-- granted under it shared has committed, and at READ COMMITTED this statement's snapshot sees
-- them all. At other isolation levels the snapshot may
-- predate a grant: a new term, a release and a forced release are refused there (SQLSTATE 0A000).
CREATE OR REPLACE FUNCTION fencing.lease_grant_ms(lease_ fencing.leases) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'fencing: ending a leadership period or starting a new one decides at READ COMMITTED only, not at % (grants on its resources may be newer than this snapshot)',
            current_setting('transaction_isolation')
            USING ERRCODE = '0A000';
    END IF;
    IF lease_.grants_ended_term >= lease_.term THEN
        RETURN 0;
    END IF;
    -- Every grant given under the lease's advisory lock (shared) has committed once this holds it.
    PERFORM pg_advisory_xact_lock(1818583397, fencing.lease_lock_id(lease_.key));
    RETURN coalesce((SELECT max(f.grant_ms) FROM fencing.fences f
                      WHERE f.lease_key = lease_.key AND f.max_term = lease_.term), 0);
END
$$;

-- A gateway says that settle_ms has passed since one of its decisions at term, made while the
-- fence was bound to lease_key and settled for settle_ms, in the settle settle_id: every write of
-- a lower term (or of the previous binding) has passed its deadline, so writes of term need not
-- wait any more. Only gateways call it (grant EXECUTE to the gateway's role only): called early,
-- it would let a write of term overtake a lower-term write still on its way to the upstream.
--
-- settle_id names the settle (schema version 10): every change of a fence's term or binding
-- starts a new one. Term, binding and length alone do not: a rebinding away and back, or a reset
-- and a raise, can start a settle equal to an older one in all three, and a mark meant for the
-- older one, sent late, would end the newer one early.
--
-- The writes of term decided before this mark still wait settle_ms from their decision and are
-- then forwarded for up to forward_ms: the row keeps settle_ms as drain_ms, and a term change
-- settles behind it until a gateway has seen drain_ms plus forward_ms pass since the mark
-- (fencing.mark_drained). Returns that length, counted from the return of this call, when the
-- settle is over (marked now or before), else NULL.
CREATE OR REPLACE FUNCTION fencing.mark_settled(resource text, term bigint, lease_key text, settle_ms bigint,
                                                settle_id bigint)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_resource  ALIAS FOR resource;
    p_term      ALIAS FOR term;
    p_lease_key ALIAS FOR lease_key;
    p_settle_ms ALIAS FOR settle_ms;
    p_settle_id ALIAS FOR settle_id;
    drain_for   bigint;
BEGIN
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_term(p_term);
    UPDATE fencing.fences f SET settle_ms = NULL, drain_ms = p_settle_ms
     WHERE f.resource = p_resource AND f.max_term = p_term AND f.lease_key IS NOT DISTINCT FROM p_lease_key
       AND f.settle_ms = p_settle_ms AND f.settle_id = p_settle_id
    RETURNING f.drain_ms + coalesce(f.forward_ms, 0) INTO drain_for;
    IF FOUND THEN
        RETURN drain_for;
    END IF;
    -- Marked before (by this gateway or another): the mark is earlier than now.
    SELECT f.drain_ms + coalesce(f.forward_ms, 0) INTO drain_for
      FROM fencing.fences f
     WHERE f.resource = p_resource AND f.max_term = p_term AND f.lease_key IS NOT DISTINCT FROM p_lease_key
       AND f.settle_ms IS NULL AND f.drain_ms = p_settle_ms AND f.settle_id = p_settle_id;
    RETURN drain_for;
END
$$;

-- A gateway says that the length fencing.mark_settled returned has passed since that call
-- returned: every write of term decided before the settle was marked over has passed its
-- deadline, so the next term need not settle behind them. Only gateways call it, as
-- fencing.mark_settled.
CREATE OR REPLACE FUNCTION fencing.mark_drained(resource text, term bigint, lease_key text, settle_ms bigint,
                                                settle_id bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_resource  ALIAS FOR resource;
    p_term      ALIAS FOR term;
    p_lease_key ALIAS FOR lease_key;
    p_settle_ms ALIAS FOR settle_ms;
    p_settle_id ALIAS FOR settle_id;
BEGIN
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_term(p_term);
    UPDATE fencing.fences f SET drain_ms = NULL
     WHERE f.resource = p_resource AND f.max_term = p_term AND f.lease_key IS NOT DISTINCT FROM p_lease_key
       AND f.settle_ms IS NULL AND f.drain_ms = p_settle_ms AND f.settle_id = p_settle_id;
    RETURN FOUND;
END
$$;

-- Lease grants (schema version 9). A gateway admits writes of term t to every resource bound to
-- a lease that it has had one admitted decision for at t, under one grant given at t on any of
-- the lease's resources (recorded on that resource's row, so fencing.lease_grant_ms counts it).
-- An operator's change of a bound fence at its lease's current term (advance_fence, rebind) must
-- therefore wait out every grant on the lease's resources at that term, not only the fence's own,
-- and must stop the decisions made before it from counting for a grant given after it: it bumps
-- the lease's fence epoch (fencing.lease_epochs), and a gateway counts a decision for a grant
-- only at the same epoch.

-- A lease's fence epoch as fencing.gate returns it: NULL for an unbound fence, 0 before any
-- change.
CREATE OR REPLACE FUNCTION fencing.epoch_of(lease_key text, epoch bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT CASE WHEN lease_key IS NULL THEN NULL ELSE coalesce(epoch, 0) END $$;

-- Locks a fence for an operator's change: its row FOR UPDATE (waiting for the writers that hold
-- it, as before version 9), then, for a bound fence at or past its lease's term, its lease's
-- advisory lock exclusively, so every grant given on the lease's resources has committed and
-- none is given until this commits. A lease already past the fence's term needs no lock: the
-- grants at the fence's term ended when the lease's new term waited for them, and no decision of
-- the fence at a later term can be made while this holds its row. The lock is tried for 100 ms
-- (a gateway batch may hold it shared while it waits for this fence row), then queued for, at
-- most 10 s (lock_timeout, SQLSTATE 55P03; such a batch and this then deadlock, which Postgres
-- ends within deadlock_timeout by failing one of them: the batch's writes fail closed, or this
-- fails having changed nothing). The lease row is neither locked nor written, so the lease's
-- renewals never wait for an operator. Returns the locked fence row (NULL: it does not exist)
-- and the lease row as read (NULL: the fence is unbound, or its lease has no row).
CREATE OR REPLACE FUNCTION fencing.lock_for_admin(resource text, OUT fence_ fencing.fences, OUT lease_ fencing.leases)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    p_resource ALIAS FOR resource;
    timeout_   text;
BEGIN
    SELECT * INTO fence_ FROM fencing.fences f WHERE f.resource = p_resource FOR UPDATE;
    IF NOT FOUND THEN
        fence_ := NULL;
        lease_ := NULL;
        RETURN;
    END IF;
    lease_ := NULL;
    IF fence_.lease_key IS NULL THEN
        RETURN;
    END IF;
    SELECT * INTO lease_ FROM fencing.leases l WHERE l.key = fence_.lease_key;
    IF FOUND AND lease_.term > fence_.max_term THEN
        RETURN; -- a lease's term only grows: fencing.await_admin_grants sees it past the fence too
    END IF;
    IF NOT pg_try_advisory_xact_lock(1818583397, fencing.lease_lock_id(fence_.lease_key)) THEN
        FOR attempt IN 1..10 LOOP
            PERFORM pg_sleep(0.010);
            EXIT WHEN pg_try_advisory_xact_lock(1818583397, fencing.lease_lock_id(fence_.lease_key));
            IF attempt = 10 THEN
                timeout_ := current_setting('lock_timeout');
                PERFORM set_config('lock_timeout', '10s', true);
                PERFORM pg_advisory_xact_lock(1818583397, fencing.lease_lock_id(fence_.lease_key));
                PERFORM set_config('lock_timeout', timeout_, true);
            END IF;
        END LOOP;
    END IF;
    -- Holding the lock, the lease's term changes only by an acquire that took it after this
    -- commits (every new term waits for it in fencing.lease_grant_ms; the first term of a lease
    -- has no grants): read at READ COMMITTED, this is the newest row.
    SELECT * INTO lease_ FROM fencing.leases l WHERE l.key = fence_.lease_key;
    IF NOT FOUND THEN
        lease_ := NULL;
    END IF;
END
$$;

-- Waits until no grant that could cover fence_ at its term lasts, for an operator's change of it
-- (after fencing.lock_for_admin): a bound fence at its lease's current term waits out the
-- longest grant on the lease's resources at that term (fencing.lease_grant_ms, READ COMMITTED
-- only), and any other, its own grants (fencing.await_grants). A bound fence's lease gets a new
-- fence epoch, committed with the change, unless the lease is past the fence's term.
CREATE OR REPLACE FUNCTION fencing.await_admin_grants(fence_ fencing.fences, lease_ fencing.leases) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    lease_ms_ bigint := 0;
BEGIN
    IF fence_.lease_key IS NULL OR lease_.term > fence_.max_term THEN
        -- Unbound, or a lease past the fence's term (fencing.lock_for_admin): its own grants.
        PERFORM fencing.await_grants(fence_);
        RETURN;
    END IF;
    IF lease_.key IS NOT NULL AND lease_.term = fence_.max_term THEN
        lease_ms_ := fencing.lease_grant_ms(lease_);
    END IF;
    INSERT INTO fencing.lease_epochs AS e (key, epoch) VALUES (fence_.lease_key, 1)
    ON CONFLICT (key) DO UPDATE SET epoch = e.epoch + 1;
    IF lease_ms_ > 0 THEN
        PERFORM pg_advisory_xact_lock(1718183525, fencing.fence_lock_id(fence_.resource));
        PERFORM fencing.sleep_ms(greatest(lease_ms_, coalesce(fence_.grant_ms, 0)));
    ELSE
        PERFORM fencing.await_grants(fence_);
    END IF;
END
$$;
