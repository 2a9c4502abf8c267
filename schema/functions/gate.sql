-- The gateway's fence decision for one write, in one statement (at READ COMMITTED, in a
-- transaction of its own). Returns how long the write must wait before it is forwarded (S5).
--
-- Every admission is decided on one version of the fence row:
--   - the common case, a write of the current term whose horizon already covers its forward
--     deadline, on the version one read sees (no lock, no write);
--   - extending the horizon, on the version an UPDATE ... WHERE max_term = term locked
--     (FOR NO KEY UPDATE: it never waits for an SQL writer's FOR KEY SHARE hold);
--   - a higher term, on the version SELECT ... FOR UPDATE locked (it waits for every open
--     writer of the lower term), which it then raises;
--   - the first write ever, on the row it inserts.
-- A version that changed under the decision is decided again, never mixed with the one read.
--
-- bind_lease: the route's lease. A resource that does not exist yet is created bound to it
-- (only for a write the lease admits: a refused write leaves no row). A resource bound to
-- another lease, or not bound at all (a protected table's or an SQL writer's), is refused as
-- wrong_lease: a write never rebinds (S4, S8). Names beginning with '/' are the gateway's
-- unbound routes' own (route prefix, '/', resource) and can never be bound.
--
-- grant_for > 0 asks for a grant (grants.sql): an admitted write of the current term also
-- returns grant_ms, how long from now the gateway may admit writes of this term for this
-- resource without asking (0: no grant). A grant is renewed only when less than three quarters
-- of grant_for remain. The grant returned never reaches past the horizon minus the caller's
-- forward timeout, so every write admitted under it has a deadline the horizon covers, whatever
-- forward timeout or grant another replica uses. A bound resource's grant ends no later than its
-- lease and is granted only while the lease row is held FOR KEY SHARE, so a release or a new term
-- (FOR UPDATE) waits for it and then counts it. A higher term waits, holding the row, until
-- every grant on the lower term has ended.
CREATE OR REPLACE FUNCTION fencing.gate(resource text, term bigint, forward_timeout interval,
                                        bind_lease text DEFAULT NULL, grant_for interval DEFAULT interval '0')
RETURNS fencing.gate_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_resource  ALIAS FOR resource;
    p_term      ALIAS FOR term;
    fence_      fencing.fences;
    lease_term_ bigint;
    lease_end_  timestamptz;
    lease_seen_ boolean;
    now_        timestamptz;
    start_      timestamptz;
    stretch_    interval;
    grant_end_  timestamptz;
    granted_ms_ bigint;
BEGIN
    -- The common case in one indexed read.
    SELECT f.resource, f.max_term, f.lease_key, f.updated_at, f.horizon, f.settle_at, f.granted_until,
           l.term, l.expires_at, l.key IS NOT NULL
      INTO fence_.resource, fence_.max_term, fence_.lease_key, fence_.updated_at, fence_.horizon,
           fence_.settle_at, fence_.granted_until, lease_term_, lease_end_, lease_seen_
      FROM fencing.fences f LEFT JOIN fencing.leases l ON l.key = f.lease_key
     WHERE f.resource = p_resource;
    now_ := clock_timestamp();
    IF FOUND AND p_term = fence_.max_term
       AND fence_.lease_key IS NOT DISTINCT FROM coalesce(bind_lease, fence_.lease_key)
       AND (fence_.lease_key IS NULL OR (lease_term_ = p_term AND lease_end_ > now_))
       AND fence_.horizon >= greatest(now_, fence_.settle_at) + forward_timeout
       AND forward_timeout > interval '0' AND forward_timeout <= interval '1 hour'
       AND (grant_for = interval '0' OR (grant_for > interval '0' AND grant_for <= interval '1 minute'
            AND fence_.granted_until >= now_ + grant_for * 0.75))
       AND current_setting('transaction_isolation') = 'read committed' THEN
        RETURN (true, 'admitted', p_term, fence_.max_term, fence_.lease_key, lease_term_,
                coalesce(fencing.remaining_ms(fence_.settle_at, now_), 0),
                fencing.grant_left(grant_for, fence_.granted_until, fence_.horizon, forward_timeout, now_)
               )::fencing.gate_result;
    END IF;

    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_term(p_term);
    PERFORM fencing.check_forward_timeout(forward_timeout);
    PERFORM fencing.check_grant(grant_for);
    IF bind_lease IS NOT NULL THEN
        PERFORM fencing.check_bindable(p_resource);
        PERFORM fencing.check_name('lease key', bind_lease);
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'fencing: fencing.gate decides at READ COMMITTED only, not at %',
            current_setting('transaction_isolation')
            USING ERRCODE = '22023';
    END IF;
    -- A quarter of the timeout more than needed, so the next writes need no update.
    stretch_ := forward_timeout * 1.25;

    FOR attempt IN 1..3 LOOP
        IF attempt > 1 THEN
            -- Read again: the version read before changed under the decision.
            SELECT f.resource, f.max_term, f.lease_key, f.updated_at, f.horizon, f.settle_at, f.granted_until,
                   l.term, l.expires_at, l.key IS NOT NULL
              INTO fence_.resource, fence_.max_term, fence_.lease_key, fence_.updated_at, fence_.horizon,
                   fence_.settle_at, fence_.granted_until, lease_term_, lease_end_, lease_seen_
              FROM fencing.fences f LEFT JOIN fencing.leases l ON l.key = f.lease_key
             WHERE f.resource = p_resource;
        END IF;
        now_ := clock_timestamp();

        IF NOT FOUND OR fence_.resource IS NULL THEN
            -- The first write ever. Never to a fence the daemons keep for themselves.
            IF left(p_resource, 16) = 'fencing.daemons/' THEN
                RETURN (false, 'wrong_lease', p_term, NULL, bind_lease, NULL, 0, 0)::fencing.gate_result;
            END IF;
            -- Bound: only the lease's current term while it is held.
            IF bind_lease IS NOT NULL THEN
                SELECT l.term, l.expires_at, true INTO lease_term_, lease_end_, lease_seen_
                  FROM fencing.leases l WHERE l.key = bind_lease;
                IF NOT FOUND OR p_term > lease_term_ THEN
                    RETURN (false, 'future_term', p_term, NULL, bind_lease, lease_term_, 0, 0)::fencing.gate_result;
                ELSIF p_term < lease_term_ THEN
                    RETURN (false, 'stale', p_term, NULL, bind_lease, lease_term_, 0, 0)::fencing.gate_result;
                ELSIF lease_end_ <= now_ THEN
                    RETURN (false, 'not_leader', p_term, NULL, bind_lease, lease_term_, 0, 0)::fencing.gate_result;
                END IF;
            END IF;
            -- No grant on the first write: the next one asks for it.
            PERFORM fencing.commit_durably();
            INSERT INTO fencing.fences AS f (resource, max_term, lease_key, updated_at, horizon)
            VALUES (p_resource, p_term, bind_lease, now_, now_ + stretch_)
            ON CONFLICT ON CONSTRAINT fences_pkey DO NOTHING;
            IF FOUND THEN
                RETURN (true, 'admitted', p_term, p_term, bind_lease, lease_term_, 0, 0)::fencing.gate_result;
            END IF;
            CONTINUE; -- a concurrent writer created it
        END IF;

        -- Refusals: safe on any version, because a maximum never decreases.
        IF fence_.lease_key IS DISTINCT FROM bind_lease AND (bind_lease IS NOT NULL OR fence_.lease_key IS NULL) THEN
            RETURN (false, 'wrong_lease', p_term, fence_.max_term, fence_.lease_key, lease_term_, 0, 0)::fencing.gate_result;
        END IF;
        IF p_term < fence_.max_term THEN
            RETURN (false, 'stale', p_term, fence_.max_term, fence_.lease_key, lease_term_, 0, 0)::fencing.gate_result;
        END IF;
        IF fence_.lease_key IS NOT NULL THEN
            IF NOT lease_seen_ OR p_term > lease_term_ THEN
                RETURN (false, 'future_term', p_term, fence_.max_term, fence_.lease_key, lease_term_, 0, 0)::fencing.gate_result;
            ELSIF p_term < lease_term_ THEN
                RETURN (false, 'stale', p_term, fence_.max_term, fence_.lease_key, lease_term_, 0, 0)::fencing.gate_result;
            ELSIF lease_end_ <= now_ THEN
                RETURN (false, 'not_leader', p_term, fence_.max_term, fence_.lease_key, lease_term_, 0, 0)::fencing.gate_result;
            END IF;
        END IF;

        IF p_term = fence_.max_term THEN
            start_ := greatest(now_, fence_.settle_at);
            IF fence_.horizon >= start_ + forward_timeout
               AND (grant_for = interval '0' OR fence_.granted_until >= now_ + grant_for * 0.75) THEN
                RETURN (true, 'admitted', p_term, fence_.max_term, fence_.lease_key, lease_term_,
                        coalesce(fencing.remaining_ms(fence_.settle_at, now_), 0),
                        fencing.grant_left(grant_for, fence_.granted_until, fence_.horizon, forward_timeout, now_)
                       )::fencing.gate_result;
            END IF;
            grant_end_ := NULL;
            IF fence_.horizon >= start_ + forward_timeout THEN
                -- Only the grant needs renewing. A term change holding the row waits for the
                -- grant to end: skip the renewal rather than wait for it (the write is admitted
                -- on the version read, as in the common case).
                PERFORM 1 FROM fencing.fences f
                  WHERE f.resource = p_resource AND f.max_term = p_term
                    AND f.lease_key IS NOT DISTINCT FROM fence_.lease_key
                    FOR NO KEY UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    RETURN (true, 'admitted', p_term, fence_.max_term, fence_.lease_key, lease_term_,
                            coalesce(fencing.remaining_ms(fence_.settle_at, now_), 0),
                            fencing.grant_left(grant_for, fence_.granted_until, fence_.horizon, forward_timeout, now_))::fencing.gate_result;
                END IF;
            END IF;
            IF grant_for > interval '0' AND fence_.lease_key IS NOT NULL THEN
                -- A bound resource's grant: on the lease version held FOR KEY SHARE (a release
                -- or a new term locks the row FOR UPDATE, so it waits for this transaction, then
                -- counts its grant; a renewal does not wait), never beyond that lease's expiry.
                SELECT l.term, l.expires_at INTO lease_term_, lease_end_
                  FROM fencing.leases l WHERE l.key = fence_.lease_key FOR KEY SHARE;
                IF NOT FOUND OR lease_term_ <> p_term OR lease_end_ <= clock_timestamp() THEN
                    CONTINUE; -- the lease moved on: decide again
                END IF;
                grant_end_ := least(clock_timestamp() + grant_for, lease_end_);
            ELSIF grant_for > interval '0' THEN
                grant_end_ := clock_timestamp() + grant_for;
            END IF;
            -- Extend the horizon (over every write the grant may admit) and the grant on the
            -- newest version, if it is still of this term and binding.
            PERFORM fencing.commit_durably();
            UPDATE fencing.fences f
               SET horizon = greatest(f.horizon, greatest(clock_timestamp(), f.settle_at) + stretch_,
                                      greatest(grant_end_, f.settle_at) + stretch_),
                   granted_until = greatest(f.granted_until, grant_end_)
             WHERE f.resource = p_resource AND f.max_term = p_term
               AND f.lease_key IS NOT DISTINCT FROM fence_.lease_key
            RETURNING f.settle_at, f.granted_until, f.horizon INTO fence_.settle_at, fence_.granted_until, fence_.horizon;
            IF NOT FOUND THEN
                CONTINUE; -- a higher term was admitted meanwhile: decide again
            END IF;
            -- Counted from now, not from the decision's start: the grant ends grant_for after a
            -- clock read made after the lock waits, so a grant is never given as longer than asked.
            granted_ms_ := fencing.grant_left(grant_for, fence_.granted_until, fence_.horizon, forward_timeout,
                                              clock_timestamp());
            RETURN (true, 'admitted', p_term, p_term, fence_.lease_key, lease_term_,
                    coalesce(fencing.remaining_ms(fence_.settle_at, now_), 0), granted_ms_)::fencing.gate_result;
        END IF;

        -- A higher term: lock the newest version, then raise it. The lower term's writes may be
        -- forwarded until its horizon: this term's writes settle behind it.
        SELECT * INTO fence_ FROM fencing.fences f WHERE f.resource = p_resource FOR UPDATE;
        IF NOT FOUND OR fence_.max_term >= p_term
           OR fence_.lease_key IS DISTINCT FROM coalesce(bind_lease, fence_.lease_key) THEN
            CONTINUE; -- changed since it was read: decide again on the newest version
        END IF;
        -- Every grant on the lower term ends first; holding the row, nobody renews one.
        PERFORM fencing.await_grant(fence_.granted_until);
        PERFORM fencing.commit_durably();
        UPDATE fencing.fences f
           SET max_term = p_term, updated_at = clock_timestamp(),
               settle_at = greatest(f.settle_at, f.horizon),
               horizon = greatest(clock_timestamp(), f.settle_at, f.horizon) + stretch_,
               granted_until = NULL
         WHERE f.resource = p_resource
        RETURNING f.settle_at INTO fence_.settle_at;
        RETURN (true, 'admitted', p_term, p_term, fence_.lease_key, lease_term_,
                coalesce(fencing.remaining_ms(fence_.settle_at, clock_timestamp()), 0), 0)::fencing.gate_result;
    END LOOP;
    RAISE EXCEPTION 'fencing: the fence of "%" kept changing', p_resource USING ERRCODE = '40001';
END
$$;
