-- The gateway's fence decision for one write, in one statement: binds the resource to
-- bind_lease first when asked and not yet bound, decides through fencing.try_admit without
-- holding a lock, and, when admitted, extends the term's horizon to cover this write's
-- forward deadline (a write only when the horizon is too short: about once per forward
-- timeout per resource). Returns how long the write must wait before it is forwarded.
CREATE OR REPLACE FUNCTION fencing.gate(resource text, term bigint, forward_timeout interval,
                                        bind_lease text DEFAULT NULL)
RETURNS fencing.gate_result
LANGUAGE plpgsql AS $$
DECLARE
    p_resource ALIAS FOR resource;
    p_term     ALIAS FOR term;
    decision   fencing.admission;
    fence_     fencing.fences;
    now_       timestamptz;
    start_     timestamptz;
    max_       bigint;
    bound_     text;
    horizon_   timestamptz;
    settle_    timestamptz;
    lease_term_ bigint;
    lease_end_ timestamptz;
BEGIN
    -- The common case in one indexed read, no write and no lock: a write of the current term,
    -- to a resource bound as asked (if at all) whose lease is held with that term, and whose
    -- horizon already covers this write's forward deadline. Anything else (including every
    -- invalid argument) takes the general path below, which decides through try_admit.
    SELECT f.max_term, f.lease_key, f.horizon, f.settle_at, l.term, l.expires_at
      INTO max_, bound_, horizon_, settle_, lease_term_, lease_end_
      FROM fencing.fences f LEFT JOIN fencing.leases l ON l.key = f.lease_key
     WHERE f.resource = p_resource;
    now_ := clock_timestamp();
    IF FOUND AND p_term = max_
       AND bound_ IS NOT DISTINCT FROM coalesce(bind_lease, bound_)
       AND (bound_ IS NULL OR (lease_term_ = p_term AND lease_end_ > now_))
       AND horizon_ >= greatest(now_, settle_) + forward_timeout
       AND forward_timeout > interval '0' AND forward_timeout <= interval '1 hour' THEN
        RETURN (true, 'admitted', p_term, max_, bound_, lease_term_,
                coalesce(fencing.remaining_ms(settle_, now_), 0))::fencing.gate_result;
    END IF;

    PERFORM fencing.check_forward_timeout(forward_timeout);
    IF bind_lease IS NOT NULL THEN
        PERFORM 1 FROM fencing.fences f WHERE f.resource = p_resource AND f.lease_key = bind_lease;
        IF NOT FOUND THEN
            -- Bind, then decide, in a subtransaction: a refused write leaves no trace, so a
            -- writer that is not the leader cannot create fence rows by naming new resources.
            BEGIN
                PERFORM fencing.bind(p_resource, bind_lease);
                decision := fencing.try_admit(p_resource, p_term, false);
                IF NOT decision.admitted THEN
                    RAISE EXCEPTION 'refused' USING ERRCODE = 'ZF409';
                END IF;
            EXCEPTION WHEN SQLSTATE 'ZF409' THEN
                RETURN (false, decision.outcome, p_term, decision.max_term, decision.lease_key,
                        decision.lease_term, 0)::fencing.gate_result;
            END;
        END IF;
    END IF;

    FOR attempt IN 1..3 LOOP
        decision := fencing.try_admit(p_resource, p_term, false);
        IF NOT decision.admitted THEN
            RETURN (false, decision.outcome, p_term, decision.max_term, decision.lease_key,
                    decision.lease_term, 0)::fencing.gate_result;
        END IF;
        SELECT * INTO fence_ FROM fencing.fences f WHERE f.resource = p_resource;
        now_ := clock_timestamp();
        start_ := greatest(now_, fence_.settle_at);
        IF fence_.horizon IS NULL OR fence_.horizon < start_ + forward_timeout THEN
            -- A quarter of the timeout more, so the next writes need no update.
            UPDATE fencing.fences f
               SET horizon = greatest(f.horizon, start_ + forward_timeout * 1.25)
             WHERE f.resource = p_resource AND f.max_term = p_term
            RETURNING * INTO fence_;
            IF NOT FOUND THEN
                CONTINUE; -- a higher term was admitted meanwhile: decide again
            END IF;
        END IF;
        RETURN (true, 'admitted', p_term, fence_.max_term, decision.lease_key, decision.lease_term,
                coalesce(fencing.remaining_ms(fence_.settle_at, now_), 0))::fencing.gate_result;
    END LOOP;
    RAISE EXCEPTION 'fencing: the fence of "%" kept changing', p_resource USING ERRCODE = '40001';
END
$$;
