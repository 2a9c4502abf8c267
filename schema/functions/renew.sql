-- Extends the lease of its valid holder; commits synchronously, so the store's expiry never
-- falls back behind the holder's deadline in a crash. Fails, changing nothing, for anyone else,
-- and for the last holder once its lease has expired.
CREATE OR REPLACE FUNCTION fencing.renew(key text, owner text, ttl interval)
RETURNS fencing.lease_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_key   ALIAS FOR key;
    p_owner ALIAS FOR owner;
    p_ttl   ALIAS FOR ttl;
    row_    fencing.leases;
    now_    timestamptz;
BEGIN
    PERFORM fencing.check_name('lease key', p_key);
    PERFORM fencing.check_name('owner', p_owner);
    PERFORM fencing.check_ttl(p_ttl);
    PERFORM fencing.commit_durably();

    -- FOR NO KEY UPDATE: a renewal never waits for a gateway that grants on this lease (which
    -- takes no lock on this row) nor for an operator's change of one of its fences; a release or
    -- a new term waits for this (FOR UPDATE).
    SELECT * INTO row_ FROM fencing.leases l WHERE l.key = p_key FOR NO KEY UPDATE;
    now_ := clock_timestamp();
    IF NOT FOUND THEN
        RETURN (false, NULL, NULL, NULL, 0, 0, false)::fencing.lease_result;
    END IF;
    IF row_.expires_at <= now_ THEN
        RETURN (false, NULL, row_.term, row_.expires_at, 0, 0, false)::fencing.lease_result;
    END IF;
    IF row_.owner <> p_owner THEN
        RETURN (false, row_.owner, row_.term, row_.expires_at,
                fencing.remaining_ms(row_.expires_at, now_), 0, false)::fencing.lease_result;
    END IF;

    -- A grant never outlasts its length, whatever the ttl: a new term waits out the longest
    -- grant on the lease's resources (fencing.lease_grant_ms).
    UPDATE fencing.leases l
       SET renewed_at = now_, expires_at = now_ + p_ttl
     WHERE l.key = p_key
    RETURNING * INTO row_;
    -- A handover requested of this term: the holder is asked to step down (schema version 14).
    RETURN (true, row_.owner, row_.term, row_.expires_at,
            fencing.remaining_ms(row_.expires_at, now_), 0,
            coalesce(row_.resign_term = row_.term, false))::fencing.lease_result;
END
$$;
