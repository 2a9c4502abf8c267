-- The gateway's fence decision for one write, in one statement (at READ COMMITTED, in a
-- transaction of its own). Returns how long the write must wait, counted from the decision,
-- before it is forwarded (S5), and how long the gateway may admit this term without asking (a
-- grant). Both are lengths: nothing here compares instants of the wall clock (schema version 8).
--
-- Every admission is decided on one version of the fence row:
--   - the common case, a write of the current term whose forward timeout the row already
--     records and that asks for no grant, on the version one read sees (no lock, no write);
--   - recording a longer forward timeout or a grant, on the version an UPDATE ... WHERE
--     max_term = term locked (FOR NO KEY UPDATE: it never waits for an SQL writer's FOR KEY
--     SHARE hold);
--   - a higher term, on the version SELECT ... FOR UPDATE locked (it waits for every open
--     writer of the lower term), which it then raises;
--   - the first write ever, on the row it inserts.
-- A version that changed under the decision is decided again, never mixed with the one read.
--
-- S5 as lengths. A gateway write of term t admitted at its decision is sent within the wait this
-- returns plus the caller's forward timeout of it (the row keeps the longest, forward_ms). When
-- a higher term is first admitted, every lower-term decision came before (a plain read sees the
-- old version only until the raise commits), so a write of the new term that waits forward_ms
-- (plus what the old term still had to settle) from its own decision, which comes after the
-- raise, starts after every lower-term write's deadline: that sum is the new term's settle_ms,
-- returned as the wait of every decision at the new term until a gateway has seen it pass
-- (fencing.mark_settled; the decisions made before that mark still wait it, so the term after
-- settles behind it, drain_ms, until a gateway marks those writes past: fencing.mark_drained).
--
-- bind_lease: the route's lease. A resource that does not exist yet is created bound to it
-- (only for a write the lease admits: a refused write leaves no row, except a first write whose
-- insert waited for a concurrent one that rolled back and whose lease moved on meanwhile: its
-- row stays, at the term the lease had granted, and only makes the next term wait its settle). A resource bound to
-- another lease, or not bound at all (a protected table's or an SQL writer's), is refused as
-- wrong_lease: a write never rebinds (S4, S8). Names beginning with '/' are the gateway's
-- unbound routes' own (route prefix, '/', resource) and can never be bound.
--
-- grant_for > 0 asks for a grant (grants.sql): an admitted write of the current term also
-- returns grant_ms, how long from its decision the gateway may admit writes of this term for this
-- resource without asking, never more than asked for. The row records the longest grant given
-- at its term; a higher term waits that long, holding the row, before it is admitted. A grant as
-- long as one recorded writes nothing: it is given under advisory locks (the fence's, and a bound
-- fence's lease's) held shared, which every term change takes exclusively before it sleeps, so a
-- renewal costs a read, not a write. A bound resource's grant never outlasts its lease as this
-- clock sees it, and a new term of the lease waits out the longest grant on its resources.
-- fencing.gate's refusal of presented by the lease lease_key as it is now (fencing.lease_refusal),
-- reporting the fence's maximum max_term; a row of NULLs when the lease admits presented or
-- lease_key is NULL (an unbound fence). What fencing.gate returns when a decision that waited,
-- or found a term change in progress, reads the lease again (S4).
CREATE OR REPLACE FUNCTION fencing.gate_refusal(lease_key text, presented bigint, max_term bigint)
RETURNS fencing.gate_result
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    refusal_ record;
BEGIN
    IF lease_key IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT r.reason, r.lease_term INTO refusal_ FROM fencing.lease_refusal(lease_key, presented) r;
    IF refusal_.reason IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN (false, refusal_.reason, presented, max_term, lease_key, refusal_.lease_term, 0, 0, NULL, NULL)::fencing.gate_result;
END
$$;

CREATE OR REPLACE FUNCTION fencing.gate(resource text, term bigint, forward_timeout interval,
                                        bind_lease text DEFAULT NULL, grant_for interval DEFAULT interval '0')
RETURNS fencing.gate_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_resource  ALIAS FOR resource;
    p_term      ALIAS FOR term;
    fence_      fencing.fences;
    lease_term_ bigint;
    lease_end_  timestamptz;
    lease_seen_ boolean;
    forward_ms_ bigint;
    grant_ms_   bigint;
    given_ms_   bigint;
    refused_    fencing.gate_result;
    -- The lease's fence epoch, read with the fence version (or before it) that the decision is
    -- made on; a grant is given only where the epoch read after the lease's advisory lock is the
    -- same (lease grants: schema version 9).
    epoch_      bigint;
    epoch_now_  bigint;
BEGIN
    forward_ms_ := ceil(extract(epoch FROM forward_timeout) * 1000)::bigint;
    -- The common case in one indexed read.
    SELECT f.resource, f.max_term, f.lease_key, f.forward_ms, f.settle_ms, f.settle_id, f.grant_ms,
           l.term, l.expires_at, l.key IS NOT NULL, fencing.epoch_of(f.lease_key, e.epoch)
      INTO fence_.resource, fence_.max_term, fence_.lease_key, fence_.forward_ms, fence_.settle_ms,
           fence_.settle_id, fence_.grant_ms, lease_term_, lease_end_, lease_seen_, epoch_
      FROM fencing.fences f LEFT JOIN fencing.leases l ON l.key = f.lease_key
           LEFT JOIN fencing.lease_epochs e ON e.key = f.lease_key
     WHERE f.resource = p_resource;
    IF FOUND AND p_term = fence_.max_term
       AND fence_.lease_key IS NOT DISTINCT FROM coalesce(bind_lease, fence_.lease_key)
       AND (fence_.lease_key IS NULL OR (lease_term_ = p_term AND lease_end_ > clock_timestamp()))
       AND fence_.forward_ms >= forward_ms_
       AND forward_timeout > interval '0' AND forward_timeout <= interval '1 hour'
       AND grant_for = interval '0'
       AND current_setting('transaction_isolation') = 'read committed' THEN
        RETURN (true, 'admitted', p_term, fence_.max_term, fence_.lease_key, lease_term_,
                coalesce(fence_.settle_ms, 0), 0, epoch_, fence_.settle_id)::fencing.gate_result;
    END IF;

    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_term(p_term);
    PERFORM fencing.check_forward_timeout(forward_timeout);
    PERFORM fencing.check_grant(grant_for);
    IF bind_lease IS NOT NULL THEN
        PERFORM fencing.check_bindable(p_resource);
        PERFORM fencing.check_name('lease key', bind_lease);
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'fencing: fencing.gate decides at READ COMMITTED only, not at %',
            current_setting('transaction_isolation')
            USING ERRCODE = '22023';
    END IF;
    grant_ms_ := floor(extract(epoch FROM grant_for) * 1000)::bigint;

    FOR attempt IN 1..3 LOOP
        IF attempt > 1 THEN
            -- Read again: the version read before changed under the decision.
            SELECT f.resource, f.max_term, f.lease_key, f.forward_ms, f.settle_ms, f.settle_id, f.grant_ms,
                   l.term, l.expires_at, l.key IS NOT NULL, fencing.epoch_of(f.lease_key, e.epoch)
              INTO fence_.resource, fence_.max_term, fence_.lease_key, fence_.forward_ms, fence_.settle_ms,
                   fence_.settle_id, fence_.grant_ms, lease_term_, lease_end_, lease_seen_, epoch_
              FROM fencing.fences f LEFT JOIN fencing.leases l ON l.key = f.lease_key
                   LEFT JOIN fencing.lease_epochs e ON e.key = f.lease_key
             WHERE f.resource = p_resource;
        END IF;

        IF NOT FOUND OR fence_.resource IS NULL THEN
            -- The first write ever. Never to a fence the daemons or a fenced log keep for
            -- themselves (fencing.check_unreserved).
            IF left(p_resource, 16) = 'fencing.daemons/' OR left(p_resource, 12) = 'fencing.log/' THEN
                RETURN (false, 'wrong_lease', p_term, NULL, bind_lease, NULL, 0, 0, NULL, NULL)::fencing.gate_result;
            END IF;
            -- Bound: only the lease's current term while it is held.
            IF bind_lease IS NOT NULL THEN
                SELECT l.term, l.expires_at, true, fencing.epoch_of(l.key, e.epoch)
                  INTO lease_term_, lease_end_, lease_seen_, epoch_
                  FROM fencing.leases l LEFT JOIN fencing.lease_epochs e ON e.key = l.key
                 WHERE l.key = bind_lease;
                IF NOT FOUND OR p_term > lease_term_ THEN
                    RETURN (false, 'future_term', p_term, NULL, bind_lease, lease_term_, 0, 0, NULL, NULL)::fencing.gate_result;
                ELSIF p_term < lease_term_ THEN
                    RETURN (false, 'stale', p_term, NULL, bind_lease, lease_term_, 0, 0, NULL, NULL)::fencing.gate_result;
                ELSIF lease_end_ <= clock_timestamp() THEN
                    RETURN (false, 'not_leader', p_term, NULL, bind_lease, lease_term_, 0, 0, NULL, NULL)::fencing.gate_result;
                END IF;
            END IF;
            -- No grant on the first write: the next one asks for it.
            PERFORM fencing.commit_durably();
            INSERT INTO fencing.fences AS f (resource, max_term, lease_key, updated_at, forward_ms)
            VALUES (p_resource, p_term, bind_lease, clock_timestamp(), forward_ms_)
            ON CONFLICT ON CONSTRAINT fences_pkey DO NOTHING;
            IF FOUND THEN
                -- The insert may have waited for a concurrent one that then rolled back: the
                -- lease is checked again (the row stays at this term, which the lease granted).
                refused_ := fencing.gate_refusal(bind_lease, p_term, p_term);
                IF refused_.outcome IS NOT NULL THEN
                    RETURN refused_;
                END IF;
                RETURN (true, 'admitted', p_term, p_term, bind_lease, lease_term_, 0, 0, epoch_, NULL)::fencing.gate_result;
            END IF;
            CONTINUE; -- a concurrent writer created it
        END IF;

        -- Refusals: safe on any version, because a maximum never decreases.
        IF fence_.lease_key IS DISTINCT FROM bind_lease AND (bind_lease IS NOT NULL OR fence_.lease_key IS NULL) THEN
            RETURN (false, 'wrong_lease', p_term, fence_.max_term, fence_.lease_key, lease_term_, 0, 0, NULL, NULL)::fencing.gate_result;
        END IF;
        IF p_term < fence_.max_term THEN
            RETURN (false, 'stale', p_term, fence_.max_term, fence_.lease_key, lease_term_, 0, 0, NULL, NULL)::fencing.gate_result;
        END IF;
        IF fence_.lease_key IS NOT NULL THEN
            IF NOT lease_seen_ OR p_term > lease_term_ THEN
                RETURN (false, 'future_term', p_term, fence_.max_term, fence_.lease_key, lease_term_, 0, 0, NULL, NULL)::fencing.gate_result;
            ELSIF p_term < lease_term_ THEN
                RETURN (false, 'stale', p_term, fence_.max_term, fence_.lease_key, lease_term_, 0, 0, NULL, NULL)::fencing.gate_result;
            ELSIF lease_end_ <= clock_timestamp() THEN
                RETURN (false, 'not_leader', p_term, fence_.max_term, fence_.lease_key, lease_term_, 0, 0, NULL, NULL)::fencing.gate_result;
            END IF;
        END IF;

        IF p_term = fence_.max_term THEN
            IF fence_.forward_ms >= forward_ms_ AND grant_ms_ = 0 THEN
                RETURN (true, 'admitted', p_term, fence_.max_term, fence_.lease_key, lease_term_,
                        coalesce(fence_.settle_ms, 0), 0, epoch_, fence_.settle_id)::fencing.gate_result;
            END IF;
            -- A bound resource's grant ends no later than its lease as this clock sees it.
            given_ms_ := CASE WHEN fence_.lease_key IS NULL THEN grant_ms_
                              ELSE least(grant_ms_, fencing.remaining_ms(lease_end_, clock_timestamp())) END;
            IF fence_.forward_ms >= forward_ms_ AND coalesce(fence_.grant_ms, 0) >= given_ms_ THEN
                -- Nothing to record (the row already says this long a grant may be held): the
                -- grant is given holding the advisory locks shared, which a term change takes
                -- exclusively before it sleeps out the grants; taken, the version read is checked
                -- again. A term change in progress holds them: no grant, and the write is
                -- admitted if the row, read again, is still the version read (the same term,
                -- binding and settle: every change of term or binding takes a new settle id).
                IF NOT pg_try_advisory_xact_lock_shared(1718183525, fencing.fence_lock_id(p_resource))
                   OR (fence_.lease_key IS NOT NULL
                       AND NOT pg_try_advisory_xact_lock_shared(1818583397, fencing.lease_lock_id(fence_.lease_key))) THEN
                    -- The version read may be older than a term change that committed since
                    -- (this backend paused between the statements): admitted only on the version
                    -- as it is now (found by the protocol model, `busy-grant-on-stale-version`).
                    PERFORM 1 FROM fencing.fences f
                      WHERE f.resource = p_resource AND f.max_term = p_term
                        AND f.lease_key IS NOT DISTINCT FROM fence_.lease_key
                        AND f.settle_id IS NOT DISTINCT FROM fence_.settle_id;
                    IF NOT FOUND THEN
                        CONTINUE;
                    END IF;
                    -- The term change in progress may be the lease's own, granted since the read:
                    -- the lease is read again (found by the protocol model with an SQL raise).
                    refused_ := fencing.gate_refusal(fence_.lease_key, p_term, fence_.max_term);
                    IF refused_.outcome IS NOT NULL THEN
                        RETURN refused_;
                    END IF;
                    RETURN (true, 'admitted', p_term, fence_.max_term, fence_.lease_key, lease_term_,
                            coalesce(fence_.settle_ms, 0), 0, epoch_, fence_.settle_id)::fencing.gate_result;
                END IF;
                PERFORM 1 FROM fencing.fences f LEFT JOIN fencing.leases l ON l.key = f.lease_key
                       LEFT JOIN fencing.lease_epochs e ON e.key = f.lease_key
                  WHERE f.resource = p_resource AND f.max_term = p_term
                    AND f.lease_key IS NOT DISTINCT FROM fence_.lease_key AND f.grant_ms >= given_ms_
                    AND (f.lease_key IS NULL OR (l.term = p_term AND l.expires_at > clock_timestamp()
                                                 AND fencing.epoch_of(f.lease_key, e.epoch) = epoch_));
                IF NOT FOUND THEN
                    CONTINUE; -- the fence or its lease moved on (or an operator changed one of its fences): decide again
                END IF;
                RETURN (true, 'admitted', p_term, fence_.max_term, fence_.lease_key, lease_term_,
                        coalesce(fence_.settle_ms, 0), given_ms_, epoch_, fence_.settle_id)::fencing.gate_result;
            END IF;
            IF fence_.forward_ms >= forward_ms_ THEN
                -- A longer grant than recorded is asked for. A term change holding the row sleeps
                -- out the grants first: give none rather than wait for it.
                PERFORM 1 FROM fencing.fences f
                  WHERE f.resource = p_resource AND f.max_term = p_term
                    AND f.lease_key IS NOT DISTINCT FROM fence_.lease_key
                    FOR NO KEY UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    -- Locked by a term change, or changed since the read: admitted only on the
                    -- version as it is now (`busy-grant-on-stale-version`).
                    PERFORM 1 FROM fencing.fences f
                      WHERE f.resource = p_resource AND f.max_term = p_term
                        AND f.lease_key IS NOT DISTINCT FROM fence_.lease_key
                        AND f.settle_id IS NOT DISTINCT FROM fence_.settle_id;
                    IF NOT FOUND THEN
                        CONTINUE;
                    END IF;
                    refused_ := fencing.gate_refusal(fence_.lease_key, p_term, fence_.max_term);
                    IF refused_.outcome IS NOT NULL THEN
                        RETURN refused_;
                    END IF;
                    RETURN (true, 'admitted', p_term, fence_.max_term, fence_.lease_key, lease_term_,
                            coalesce(fence_.settle_ms, 0), 0, epoch_, fence_.settle_id)::fencing.gate_result;
                END IF;
            END IF;
            IF given_ms_ > 0 AND fence_.lease_key IS NOT NULL THEN
                -- A bound resource's grant: holding the lease's advisory lock shared (a new term of
                -- the lease takes it exclusively, after this transaction, then waits out the grant's
                -- length; a lease's new term in progress holds it: no grant), on the lease version
                -- read after it.
                IF NOT pg_try_advisory_xact_lock_shared(1818583397, fencing.lease_lock_id(fence_.lease_key)) THEN
                    given_ms_ := 0;
                ELSE
                    SELECT l.term, l.expires_at, fencing.epoch_of(l.key, e.epoch) INTO lease_term_, lease_end_, epoch_now_
                      FROM fencing.leases l LEFT JOIN fencing.lease_epochs e ON e.key = l.key
                     WHERE l.key = fence_.lease_key;
                    IF NOT FOUND OR lease_term_ <> p_term OR lease_end_ <= clock_timestamp()
                       OR epoch_now_ IS DISTINCT FROM epoch_ THEN
                        CONTINUE; -- the lease moved on, or an operator changed one of its fences: decide again
                    END IF;
                    given_ms_ := least(given_ms_, fencing.remaining_ms(lease_end_, clock_timestamp()));
                END IF;
            END IF;
            -- Record the forward timeout and the grant on the newest version, if it is still of
            -- this term and binding (this waits for the row if a term change holds it, and then
            -- finds it changed).
            PERFORM fencing.commit_durably();
            UPDATE fencing.fences f
               SET forward_ms = greatest(f.forward_ms, forward_ms_),
                   grant_ms = nullif(greatest(coalesce(f.grant_ms, 0), given_ms_), 0)
             WHERE f.resource = p_resource AND f.max_term = p_term
               AND f.lease_key IS NOT DISTINCT FROM fence_.lease_key
            RETURNING f.settle_ms, f.settle_id INTO fence_.settle_ms, fence_.settle_id;
            IF NOT FOUND THEN
                CONTINUE; -- a higher term was admitted meanwhile: decide again
            END IF;
            -- The update may have waited for another gateway's: the lease is checked again (what
            -- it recorded for this term stays; a longer grant recorded only makes the next term
            -- wait longer).
            refused_ := fencing.gate_refusal(fence_.lease_key, p_term, p_term);
            IF refused_.outcome IS NOT NULL THEN
                RETURN refused_;
            END IF;
            RETURN (true, 'admitted', p_term, p_term, fence_.lease_key, lease_term_,
                    coalesce(fence_.settle_ms, 0), given_ms_, epoch_, fence_.settle_id)::fencing.gate_result;
        END IF;

        -- A higher term: lock the newest version, wait out the lower term's grants, raise it.
        -- The lower term's writes may be forwarded for a while yet: this term's settle.
        SELECT * INTO fence_ FROM fencing.fences f WHERE f.resource = p_resource FOR UPDATE;
        IF NOT FOUND OR fence_.max_term >= p_term
           OR fence_.lease_key IS DISTINCT FROM coalesce(bind_lease, fence_.lease_key) THEN
            CONTINUE; -- changed since it was read: decide again on the newest version
        END IF;
        PERFORM fencing.await_grants(fence_);
        -- A bound fence: the lease may have moved on while this raise waited for the row (an open
        -- SQL writer holds it until its transaction ends) and for the grants. S4 refuses the old
        -- term the moment a new one is granted: the lease is read again, now, and the raise is
        -- refused if its term is no longer current (found by the protocol model). A lease's term
        -- only grows, so the refusal is final (no attempt of the loop is spent on it). No lock on
        -- the lease: an open transaction that raised must not hold up the lease's next term (the
        -- new term's writes wait for the fence row instead).
        refused_ := fencing.gate_refusal(fence_.lease_key, p_term, fence_.max_term);
        IF refused_.outcome IS NOT NULL THEN
            RETURN refused_;
        END IF;
        PERFORM fencing.commit_durably();
        UPDATE fencing.fences f
           SET max_term = p_term, updated_at = clock_timestamp(),
               settle_ms = fencing.next_settle(fence_), settle_id = nextval('fencing.settle_ids'),
               forward_ms = forward_ms_, grant_ms = NULL, drain_ms = NULL
         WHERE f.resource = p_resource
        RETURNING f.settle_ms, f.settle_id INTO fence_.settle_ms, fence_.settle_id;
        RETURN (true, 'admitted', p_term, p_term, fence_.lease_key, lease_term_,
                coalesce(fence_.settle_ms, 0), 0, epoch_, fence_.settle_id)::fencing.gate_result;
    END LOOP;
    RAISE EXCEPTION 'fencing: the fence of "%" kept changing', p_resource USING ERRCODE = '40001';
END
$$;
