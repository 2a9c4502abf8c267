-- Graceful handover (schema version 14): ask the holder of a lease to step down, optionally
-- naming the owner that should lead next. Returns the term asked to step down; NULL, changing
-- nothing, when nobody holds the lease. Audited. The holder learns of it from its renewal
-- (lease_result.resign_requested) or its watch; its release then reserves the next term for
-- the successor (fencing.release).
-- With holder_prefix, only a holder whose owner starts with it is asked (the gateway passes a
-- client's `<client>/`, so a client asks only its own owners).
DO $$
BEGIN
    -- The four-argument version of development (guarded, so a fresh install prints no NOTICE).
    IF to_regprocedure('fencing.request_resign(text, text, text, text)') IS NOT NULL THEN
        DROP FUNCTION fencing.request_resign(text, text, text, text);
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION fencing.request_resign(key text, actor text, reason text, successor text DEFAULT NULL,
                                                  holder_prefix text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_key       ALIAS FOR key;
    p_successor ALIAS FOR successor;
    row_        fencing.leases;
BEGIN
    PERFORM fencing.check_name('lease key', p_key);
    PERFORM fencing.check_name('actor', actor);
    PERFORM fencing.check_name('reason', reason);
    IF p_successor IS NOT NULL THEN
        PERFORM fencing.check_name('successor', p_successor);
    END IF;
    PERFORM fencing.commit_durably();
    SELECT * INTO row_ FROM fencing.leases l WHERE l.key = p_key FOR NO KEY UPDATE;
    IF NOT FOUND OR row_.expires_at <= clock_timestamp()
       OR (holder_prefix IS NOT NULL AND left(row_.owner, length(holder_prefix)) <> holder_prefix) THEN
        RETURN NULL;
    END IF;
    UPDATE fencing.leases l
       SET resign_term = row_.term, resign_successor = p_successor, resign_requested_at = clock_timestamp()
     WHERE l.key = p_key;
    INSERT INTO fencing.admin_audit (actor, action, target, reason, before, after)
    VALUES (actor, 'request_resign', p_key, reason,
            jsonb_build_object('owner', row_.owner, 'term', row_.term),
            jsonb_build_object('successor', p_successor));
    RETURN row_.term;
END
$$;

-- Whether `owner` is the successor `reserved`: the same owner, or one of its incarnations
-- (`<reserved>#<incarnation>` with no further `#`, as the Rust elector names itself).
CREATE OR REPLACE FUNCTION fencing.is_successor(owner text, reserved text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT owner = reserved
        OR (left(owner, length(reserved) + 1) = reserved || '#'
            AND strpos(substr(owner, length(reserved) + 2), '#') = 0
            AND length(owner) > length(reserved) + 1)
$$;

-- What a release or a force-release of `lease_` at `now_` reserves: the named successor of a
-- handover requested of its term, until least(its ttl, 10 s) from now.
CREATE OR REPLACE FUNCTION fencing.reserve_for(lease_ fencing.leases, now_ timestamptz)
RETURNS TABLE (reserved_for text, reserved_until timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT lease_.resign_successor,
           now_ + least(greatest(lease_.expires_at - lease_.renewed_at, interval '0'), interval '10 seconds')
     WHERE lease_.resign_term = lease_.term AND lease_.resign_successor IS NOT NULL
$$;

-- Ends the period of `term` of `key` now, if that term still holds the lease (a holder asked to
-- step down that did not in time): as fencing.force_release (audited, lock-delay and the
-- successor's reservation apply), but never a later term's. Whether it ended one.
CREATE OR REPLACE FUNCTION fencing.force_handover(key text, term bigint, actor text, reason text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_key  ALIAS FOR key;
    p_term ALIAS FOR term;
    row_   fencing.leases;
BEGIN
    PERFORM fencing.check_name('lease key', p_key);
    PERFORM fencing.check_term(p_term);
    SELECT * INTO row_ FROM fencing.leases l WHERE l.key = p_key FOR UPDATE;
    IF NOT FOUND OR row_.term <> p_term OR row_.expires_at <= clock_timestamp() THEN
        RETURN false;
    END IF;
    PERFORM fencing.force_release(p_key, actor, reason);
    RETURN true;
END
$$;
