-- Ends the current leadership period of key, whoever holds it (a dead owner, after an
-- incident), and records it. The row and its term stay, so the next holder gets term + 1.
CREATE OR REPLACE FUNCTION fencing.force_release(key text, actor text, reason text)
RETURNS fencing.leases
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_key ALIAS FOR key;
    old_  fencing.leases;
    new_  fencing.leases;
BEGIN
    PERFORM fencing.check_name('lease key', p_key);
    PERFORM fencing.check_name('actor', actor);
    PERFORM fencing.check_name('reason', reason);
    PERFORM fencing.commit_durably();
    SELECT * INTO old_ FROM fencing.leases l WHERE l.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fencing: no lease %', p_key USING ERRCODE = '22023';
    END IF;
    -- Grants on the lease's resources outlive the release: the next term waits for them.
    PERFORM fencing.lease_grant_ms(old_);
    UPDATE fencing.leases l SET expires_at = least(l.expires_at, clock_timestamp())
     WHERE l.key = p_key
    RETURNING * INTO new_;
    UPDATE fencing.lease_history h SET ended_at = new_.expires_at, end_reason = 'force_released'
     WHERE h.key = p_key AND h.term = new_.term AND h.ended_at IS NULL AND new_.expires_at < old_.expires_at;
    INSERT INTO fencing.admin_audit (actor, action, target, reason, before, after)
    VALUES (actor, 'force_release', p_key, reason, to_jsonb(old_), to_jsonb(new_));
    RETURN new_;
END
$$;
