-- Ends the valid holder's period at once, so a follower can take over without waiting
-- for expiry. The row stays, so the next period gets a new term. Returns false, changing
-- nothing, when owner does not hold the lease.
CREATE OR REPLACE FUNCTION fencing.release(key text, owner text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_key   ALIAS FOR key;
    p_owner ALIAS FOR owner;
    row_    fencing.leases;
    now_    timestamptz;
BEGIN
    PERFORM fencing.check_name('lease key', p_key);
    PERFORM fencing.check_name('owner', p_owner);
    PERFORM fencing.commit_durably();

    SELECT * INTO row_ FROM fencing.leases l WHERE l.key = p_key FOR UPDATE;
    now_ := clock_timestamp();
    IF NOT FOUND OR row_.owner <> p_owner OR row_.expires_at <= now_ THEN
        RETURN false;
    END IF;
    -- Grants on the lease's resources outlive the release: the next term waits for them
    -- (fencing.lease_grant_ms; called here too, so a release decides at READ COMMITTED only).
    PERFORM fencing.lease_grant_ms(row_);
    -- After a handover was requested of this term: 'handed_over', and a named successor has
    -- the next term to itself for a while (fencing.reserve_for).
    UPDATE fencing.leases l
       SET expires_at = now_,
           reserved_for = (SELECT r.reserved_for FROM fencing.reserve_for(row_, now_) r),
           reserved_until = (SELECT r.reserved_until FROM fencing.reserve_for(row_, now_) r)
     WHERE l.key = p_key;
    UPDATE fencing.lease_history h
       SET ended_at = now_,
           end_reason = CASE WHEN row_.resign_term = row_.term THEN 'handed_over' ELSE 'released' END
     WHERE h.key = p_key AND h.term = row_.term AND h.ended_at IS NULL;
    RETURN true;
END
$$;
