-- fencing-gateway schema, version 2: ordering at the upstream (invariant S5).
--
-- A gateway forwards an admitted write only until its forward deadline. Each fence keeps
-- a horizon, a time no forward deadline of the current term's gateway writes is later than,
-- and settle_at, the horizon of the lower terms when the current term was first admitted.
-- A gateway write of the current term is forwarded only once settle_at has passed, so it can
-- never overtake a lower-term write that another replica may still be sending.
--
-- Apply with psql in one transaction:
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 --single-transaction -f 0002_gate.sql

ALTER TABLE fencing.fences ADD COLUMN IF NOT EXISTS horizon timestamptz NULL;
ALTER TABLE fencing.fences ADD COLUMN IF NOT EXISTS settle_at timestamptz NULL;

COMMENT ON COLUMN fencing.fences.horizon IS
    'No gateway write of max_term admitted so far may be forwarded after this time; NULL when none was.';
COMMENT ON COLUMN fencing.fences.settle_at IS
    'Writes of terms below max_term may be forwarded until this time; gateway writes of max_term wait for it.';

-- The result row of fencing.gate and fencing.gate_lease.
DO $$
BEGIN
    IF to_regtype('fencing.gate_result') IS NULL THEN
        CREATE TYPE fencing.gate_result AS (
            admitted   boolean,
            -- admitted, stale, future_term, not_leader
            outcome    text,
            -- the term decided on: the presented one, or the lease's in stamp mode
            term       bigint,
            max_term   bigint,
            lease_key  text,
            lease_term bigint,
            -- how long the gateway must wait before forwarding (S5)
            wait_ms    bigint
        );
    END IF;
END
$$;

-- Refuses a null, non-positive or overlong forward timeout with SQLSTATE 22023.
CREATE OR REPLACE FUNCTION fencing.check_forward_timeout(forward_timeout interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF forward_timeout IS NULL OR forward_timeout <= interval '0' OR forward_timeout > interval '1 hour' THEN
        RAISE EXCEPTION 'fencing: forward timeout must be positive and at most 01:00:00, got %',
            coalesce(forward_timeout::text, 'null')
            USING ERRCODE = '22023';
    END IF;
END
$$;

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

-- The gateway's stamp mode: the write's term is lease_key's current term, when owner holds that
-- lease unexpired; otherwise the write is refused as not_leader.
CREATE OR REPLACE FUNCTION fencing.gate_lease(resource text, lease_key text, owner text,
                                              forward_timeout interval, bind_lease text DEFAULT NULL)
RETURNS fencing.gate_result
LANGUAGE plpgsql AS $$
DECLARE
    p_resource  ALIAS FOR resource;
    p_lease_key ALIAS FOR lease_key;
    p_owner     ALIAS FOR owner;
    lease_      fencing.leases;
BEGIN
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_name('lease key', p_lease_key);
    PERFORM fencing.check_name('owner', p_owner);
    SELECT * INTO lease_ FROM fencing.leases l WHERE l.key = p_lease_key;
    IF NOT FOUND OR lease_.owner <> p_owner OR lease_.expires_at <= clock_timestamp() THEN
        RETURN (false, 'not_leader', NULL,
                (SELECT f.max_term FROM fencing.fences f WHERE f.resource = p_resource),
                p_lease_key, lease_.term, 0)::fencing.gate_result;
    END IF;
    RETURN fencing.gate(p_resource, lease_.term, forward_timeout, bind_lease);
END
$$;

-- Many gateway decisions in one statement, one result row per item in input order: item i is
-- fencing.gate_lease(resources[i], lease_keys[i], owners[i], ...) when lease_keys[i] is set,
-- else fencing.gate(resources[i], terms[i], ...). A gateway batches the decisions of concurrent
-- writes into one round trip; it sorts items by resource, so concurrent batches lock in one order.
CREATE OR REPLACE FUNCTION fencing.gate_many(resources text[], terms bigint[], lease_keys text[], owners text[],
                                             bind_leases text[], forward_timeout interval)
RETURNS SETOF fencing.gate_result
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(array_length(resources, 1), 0) <> coalesce(array_length(terms, 1), 0)
       OR coalesce(array_length(resources, 1), 0) <> coalesce(array_length(lease_keys, 1), 0)
       OR coalesce(array_length(resources, 1), 0) <> coalesce(array_length(owners, 1), 0)
       OR coalesce(array_length(resources, 1), 0) <> coalesce(array_length(bind_leases, 1), 0) THEN
        RAISE EXCEPTION 'fencing: gate_many needs arrays of one length' USING ERRCODE = '22023';
    END IF;
    FOR i IN 1..coalesce(array_length(resources, 1), 0) LOOP
        IF lease_keys[i] IS NOT NULL THEN
            RETURN NEXT fencing.gate_lease(resources[i], lease_keys[i], owners[i], forward_timeout, bind_leases[i]);
        ELSE
            RETURN NEXT fencing.gate(resources[i], terms[i], forward_timeout, bind_leases[i]);
        END IF;
    END LOOP;
END
$$;

INSERT INTO fencing.schema_migrations (version, name) VALUES (2, 'gate')
ON CONFLICT (version) DO NOTHING;
