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
    -- A handover requested of this term and forced: its named successor still comes first.
    UPDATE fencing.leases l
       SET expires_at = least(l.expires_at, clock_timestamp()),
           reserved_for = CASE WHEN old_.expires_at > clock_timestamp()
                               THEN (SELECT r.reserved_for FROM fencing.reserve_for(old_, clock_timestamp()) r)
                               ELSE l.reserved_for END,
           reserved_until = CASE WHEN old_.expires_at > clock_timestamp()
                                 THEN (SELECT r.reserved_until FROM fencing.reserve_for(old_, clock_timestamp()) r)
                                 ELSE l.reserved_until END
     WHERE l.key = p_key
    RETURNING * INTO new_;
    UPDATE fencing.lease_history h SET ended_at = new_.expires_at, end_reason = 'force_released'
     WHERE h.key = p_key AND h.term = new_.term AND h.ended_at IS NULL AND new_.expires_at < old_.expires_at;
    -- The successor's reservation (a handover forced) counts from the end of the lock-delay.
    IF new_.reserved_until IS NOT NULL AND new_.expires_at < old_.expires_at THEN
        UPDATE fencing.leases l
           SET reserved_until = l.reserved_until
                                + fencing.lock_delay_left(new_, clock_timestamp()) * interval '1 millisecond'
         WHERE l.key = p_key
        RETURNING * INTO new_;
    END IF;
    INSERT INTO fencing.admin_audit (actor, action, target, reason, before, after)
    VALUES (actor, 'force_release', p_key, reason, to_jsonb(old_), to_jsonb(new_));
    RETURN new_;
END
$$;
