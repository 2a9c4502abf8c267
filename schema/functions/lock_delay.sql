-- Lock-delay (schema version 12). How much of a lease's lock-delay is left at now_ (ms, 0 when
-- none): after a period that ended without a release (it expired, or was force-released), no new
-- term starts until the key's delay has passed since the period's end, on the store's clock. A
-- lease held, released by its holder (handed over included), or never acquired has none.
CREATE OR REPLACE FUNCTION fencing.lock_delay_left(lease_ fencing.leases, now_ timestamptz) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    delay_ms_ bigint;
BEGIN
    IF lease_.key IS NULL OR lease_.expires_at > now_ THEN
        RETURN 0;
    END IF;
    IF EXISTS (SELECT 1 FROM fencing.lease_history h
                WHERE h.key = lease_.key AND h.term = lease_.term
                  AND h.end_reason IN ('released', 'handed_over')) THEN
        RETURN 0;
    END IF;
    SELECT coalesce((SELECT s.lock_delay_ms FROM fencing.lease_settings s WHERE s.key = lease_.key),
                    (SELECT d.lock_delay_ms FROM fencing.lease_defaults d), 0)
      INTO delay_ms_;
    IF delay_ms_ = 0 OR lease_.expires_at + delay_ms_ * interval '1 millisecond' <= now_ THEN
        RETURN 0;
    END IF;
    -- Rounded up: the last fraction of a millisecond is delay too.
    RETURN greatest(fencing.remaining_ms(lease_.expires_at + delay_ms_ * interval '1 millisecond', now_), 1);
END
$$;

-- Sets the lock-delay of key (NULL: the default of every key without a setting of its own), at
-- most one hour; audited. A key's setting of NULL delay removes it (the default applies again).
CREATE OR REPLACE FUNCTION fencing.set_lock_delay(key text, delay interval, actor text, reason text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_key   ALIAS FOR key;
    ms_     bigint;
    before_ jsonb;
BEGIN
    IF p_key IS NOT NULL THEN
        PERFORM fencing.check_name('lease key', p_key);
    END IF;
    PERFORM fencing.check_name('actor', actor);
    PERFORM fencing.check_name('reason', reason);
    IF delay IS NULL AND p_key IS NULL THEN
        RAISE EXCEPTION 'fencing: the default lock-delay cannot be removed; set it to 0 for none'
            USING ERRCODE = '22023';
    END IF;
    IF delay IS NOT NULL AND (delay < interval '0' OR delay > interval '1 hour') THEN
        RAISE EXCEPTION 'fencing: a lock-delay is between 0 and 1 hour, got %', delay USING ERRCODE = '22023';
    END IF;
    ms_ := ceil(extract(epoch FROM delay) * 1000)::bigint;
    IF p_key IS NULL THEN
        SELECT to_jsonb(d) INTO before_ FROM fencing.lease_defaults d;
        UPDATE fencing.lease_defaults SET lock_delay_ms = ms_;
    ELSE
        SELECT to_jsonb(s) INTO before_ FROM fencing.lease_settings s WHERE s.key = p_key;
        IF ms_ IS NULL THEN
            DELETE FROM fencing.lease_settings s WHERE s.key = p_key;
        ELSE
            INSERT INTO fencing.lease_settings AS s (key, lock_delay_ms) VALUES (p_key, ms_)
            ON CONFLICT ON CONSTRAINT lease_settings_pkey DO UPDATE SET lock_delay_ms = excluded.lock_delay_ms;
        END IF;
    END IF;
    INSERT INTO fencing.admin_audit (actor, action, target, reason, before, after)
    VALUES (actor, 'set_lock_delay', coalesce(p_key, '(default)'), reason, before_,
            jsonb_build_object('lock_delay_ms', ms_));
END
$$;
