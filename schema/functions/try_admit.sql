CREATE OR REPLACE FUNCTION fencing.try_admit(resource text, term bigint, hold_lock boolean DEFAULT true)
RETURNS fencing.admission
LANGUAGE plpgsql AS $$
DECLARE
    p_resource ALIAS FOR resource;
    p_term     ALIAS FOR term;
    fence_     fencing.fences;
    lease_     fencing.leases;
    max_       bigint;
    attempts   integer := 0;
BEGIN
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_term(p_term);

    LOOP
        attempts := attempts + 1;
        IF attempts > 3 THEN
            RAISE EXCEPTION 'fencing: could not read the fence row of "%"', p_resource
                USING ERRCODE = '40001';
        END IF;
        -- A plain read first: a refusal needs no lock, because the maximum never decreases.
        SELECT * INTO fence_ FROM fencing.fences f WHERE f.resource = p_resource;
        IF NOT FOUND THEN
            -- First write ever to an unbound resource.
            INSERT INTO fencing.fences AS f (resource, max_term, lease_key, updated_at)
            VALUES (p_resource, p_term, NULL, clock_timestamp())
            ON CONFLICT ON CONSTRAINT fences_pkey DO NOTHING;
            IF FOUND THEN
                RETURN (true, 'admitted', p_term, NULL, NULL)::fencing.admission;
            END IF;
            CONTINUE; -- a concurrent writer created it: decide against its row
        END IF;

        IF p_term < fence_.max_term THEN
            RETURN (false, 'stale', fence_.max_term, fence_.lease_key, NULL)::fencing.admission;
        END IF;

        IF fence_.lease_key IS NOT NULL THEN
            SELECT * INTO lease_ FROM fencing.leases l WHERE l.key = fence_.lease_key;
            IF NOT FOUND OR p_term > lease_.term THEN
                RETURN (false, 'future_term', fence_.max_term, fence_.lease_key, lease_.term)::fencing.admission;
            END IF;
            IF p_term < lease_.term THEN
                RETURN (false, 'stale', fence_.max_term, fence_.lease_key, lease_.term)::fencing.admission;
            END IF;
            IF lease_.expires_at <= clock_timestamp() THEN
                RETURN (false, 'not_leader', fence_.max_term, fence_.lease_key, lease_.term)::fencing.admission;
            END IF;
        END IF;

        IF p_term = fence_.max_term THEN
            IF NOT hold_lock THEN
                RETURN (true, 'admitted', p_term, fence_.lease_key, lease_.term)::fencing.admission;
            END IF;
            -- Re-read under a share lock: a concurrent raise is waited for, then seen.
            SELECT f.max_term INTO max_ FROM fencing.fences f
             WHERE f.resource = p_resource FOR SHARE;
            IF max_ = p_term THEN
                RETURN (true, 'admitted', p_term, fence_.lease_key, lease_.term)::fencing.admission;
            END IF;
            RETURN (false, 'stale', max_, fence_.lease_key, lease_.term)::fencing.admission;
        END IF;

        -- A higher term: raise the maximum. The WHERE clause is re-checked against the newest
        -- row version after any concurrent writer commits, so two raises can never both win
        -- with the lower one last.
        -- Writes of the lower terms may still be on their way to the upstream until the horizon:
        -- the new term's gateway writes settle behind it (invariant S5).
        UPDATE fencing.fences f
           SET max_term = p_term, updated_at = clock_timestamp(),
               settle_at = CASE WHEN f.max_term < p_term THEN greatest(f.settle_at, f.horizon) ELSE f.settle_at END,
               horizon = CASE WHEN f.max_term < p_term THEN NULL ELSE f.horizon END
         WHERE f.resource = p_resource AND f.max_term <= p_term
        RETURNING f.max_term INTO max_;
        IF FOUND THEN
            RETURN (true, 'admitted', p_term, fence_.lease_key, lease_.term)::fencing.admission;
        END IF;
        SELECT f.max_term INTO max_ FROM fencing.fences f WHERE f.resource = p_resource;
        RETURN (false, 'stale', max_, fence_.lease_key, lease_.term)::fencing.admission;
    END LOOP;
END
$$;
