-- Acquires the lease for owner, or reports who holds it.
--
-- A new leadership period (the lease was absent, expired or released) gets term + 1 and a row
-- of fencing.lease_history, in the same transaction. The valid holder acquiring again keeps its
-- term and extends its lease, like a renewal, unless new_period: then its period ends at once
-- (history: abandoned) and the next term starts, so a holder that ended its period locally (a
-- failed or late renewal, a passed deadline) never leads again with the same term (S2). The
-- election library passes new_period on every acquire. The transaction commits synchronously
-- whatever the session or database says (S1, S2 across a crash).
-- The three-argument version of schema version 1 (guarded, so a fresh install prints no NOTICE).
DO $$
BEGIN
    IF to_regprocedure('fencing.acquire(text, text, interval)') IS NOT NULL THEN
        DROP FUNCTION fencing.acquire(text, text, interval);
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION fencing.acquire(key text, owner text, ttl interval, new_period boolean DEFAULT false)
RETURNS fencing.lease_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_key   ALIAS FOR key;
    p_owner ALIAS FOR owner;
    p_ttl   ALIAS FOR ttl;
    row_    fencing.leases;
    now_    timestamptz;
    grant_ms_ bigint;
    delay_ms_ bigint;
BEGIN
    PERFORM fencing.check_name('lease key', p_key);
    PERFORM fencing.check_name('owner', p_owner);
    PERFORM fencing.check_ttl(p_ttl);
    PERFORM fencing.commit_durably();

    SELECT * INTO row_ FROM fencing.leases l WHERE l.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        now_ := clock_timestamp();
        INSERT INTO fencing.leases AS l (key, owner, term, acquired_at, renewed_at, expires_at)
        VALUES (p_key, p_owner, 1, now_, now_, now_ + p_ttl)
        ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING
        RETURNING * INTO row_;
        IF FOUND THEN
            INSERT INTO fencing.lease_history (key, term, owner, granted_at)
            VALUES (p_key, 1, p_owner, now_)
            ON CONFLICT DO NOTHING;
            RETURN (true, p_owner, 1::bigint, row_.expires_at,
                    fencing.remaining_ms(row_.expires_at, now_), 0, false)::fencing.lease_result;
        END IF;
        -- A concurrent caller created the row first: decide against its row.
        SELECT * INTO row_ FROM fencing.leases l WHERE l.key = p_key FOR UPDATE;
    END IF;

    -- The clock is read after the row lock is held, so waiting for the lock never
    -- makes an expired lease look valid.
    now_ := clock_timestamp();
    IF row_.expires_at > now_ AND row_.owner <> p_owner THEN
        RETURN (false, row_.owner, row_.term, row_.expires_at,
                fencing.remaining_ms(row_.expires_at, now_), 0, false)::fencing.lease_result;
    END IF;

    IF row_.expires_at > now_ AND NOT coalesce(new_period, false) THEN
        -- The valid holder again: same period, same term, longer lease.
        UPDATE fencing.leases l
           SET renewed_at = now_, expires_at = now_ + p_ttl
         WHERE l.key = p_key
        RETURNING * INTO row_;
        RETURN (true, row_.owner, row_.term, row_.expires_at,
                fencing.remaining_ms(row_.expires_at, now_), 0,
                coalesce(row_.resign_term = row_.term, false))::fencing.lease_result;
    END IF;

    -- The valid holder asking for a new period while a handover is requested of its term: the
    -- period ends here as a handover, as its release would (a new term of its own would drop
    -- the request), and the caller is refused; it may try again once no successor comes first.
    IF row_.expires_at > now_ AND row_.resign_term = row_.term THEN
        PERFORM fencing.lease_grant_ms(row_);
        UPDATE fencing.lease_history h SET ended_at = now_, end_reason = 'handed_over'
         WHERE h.key = p_key AND h.term = row_.term AND h.ended_at IS NULL;
        UPDATE fencing.leases l
           SET expires_at = now_,
               reserved_for = (SELECT r.reserved_for FROM fencing.reserve_for(row_, now_) r),
               reserved_until = (SELECT r.reserved_until FROM fencing.reserve_for(row_, now_) r)
         WHERE l.key = p_key
        RETURNING * INTO row_;
        RETURN (false, row_.reserved_for, row_.term, coalesce(row_.reserved_until, row_.expires_at),
                fencing.remaining_ms(coalesce(row_.reserved_until, row_.expires_at), now_), 0, true)::fencing.lease_result;
    END IF;

    -- Lock-delay: after a period that ended without a release, no new term until the key's
    -- delay has passed since its end (the valid holder asking for a new period ends its own
    -- period now: none).
    IF row_.expires_at <= now_ THEN
        delay_ms_ := fencing.lock_delay_left(row_, now_);
        IF delay_ms_ > 0 THEN
            RETURN (false, NULL, row_.term, row_.expires_at, 0, delay_ms_, false)::fencing.lease_result;
        END IF;
    END IF;

    -- A handover to a named successor: until it acquires, or its reservation ends, the next
    -- term is its alone (fencing.release); anyone else is answered as if it held the lease.
    IF row_.expires_at <= now_ AND row_.reserved_for IS NOT NULL AND row_.reserved_until > now_
       AND NOT fencing.is_successor(p_owner, row_.reserved_for) THEN
        RETURN (false, row_.reserved_for, row_.term, row_.reserved_until,
                fencing.remaining_ms(row_.reserved_until, now_), 0, false)::fencing.lease_result;
    END IF;

    -- A new leadership period, once every grant on the old term has ended (grants.sql): until
    -- then gateways may still admit the old term. Holding the row, no grant is given meanwhile;
    -- each given before lasts at most the longest recorded. The clock is read again after.
    grant_ms_ := fencing.lease_grant_ms(row_);
    IF grant_ms_ > 0 THEN
        PERFORM fencing.sleep_ms(grant_ms_);
        now_ := clock_timestamp();
    END IF;
    -- The previous period ended when its lease expired, or now when its holder asks for a new
    -- period while still valid.
    UPDATE fencing.lease_history h
       SET ended_at = least(row_.expires_at, now_),
           end_reason = CASE WHEN row_.expires_at > now_ THEN 'abandoned' ELSE 'expired' END
     WHERE h.key = p_key AND h.term = row_.term AND h.ended_at IS NULL;
    UPDATE fencing.leases l
       SET owner = p_owner, term = l.term + 1,
           acquired_at = now_, renewed_at = now_, expires_at = now_ + p_ttl,
           grants_ended_term = CASE WHEN grant_ms_ > 0 THEN l.term ELSE l.grants_ended_term END,
           resign_term = NULL, resign_successor = NULL, resign_requested_at = NULL,
           reserved_for = NULL, reserved_until = NULL
     WHERE l.key = p_key
    RETURNING * INTO row_;
    INSERT INTO fencing.lease_history (key, term, owner, granted_at)
    VALUES (p_key, row_.term, p_owner, now_)
    ON CONFLICT DO NOTHING;
    RETURN (true, row_.owner, row_.term, row_.expires_at,
            fencing.remaining_ms(row_.expires_at, now_), 0, false)::fencing.lease_result;
END
$$;
