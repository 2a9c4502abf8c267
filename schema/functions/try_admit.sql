-- The fence decision of SQL writers (fencing.admit, the guard), without raising.
--
-- Admitted when term >= the resource's maximum and, for a bound resource, term is the bound
-- lease's term and that lease is held (unexpired by this database's clock). A refusal writes
-- nothing. Every admission is decided on one version of the fence row, and holds it until the
-- transaction ends (when hold_lock):
--   - an equal term holds the row FOR KEY SHARE, so no higher term can be admitted before this
--     transaction commits, while the gateway may still record forward timeouts and grants (FOR
--     NO KEY UPDATE does not conflict with it);
--   - a higher term locks the row FOR UPDATE, which waits for every open equal-term writer,
--     then raises the maximum.
-- At REPEATABLE READ and SERIALIZABLE the transaction's snapshot may be older than the newest
-- fence or lease: a probe lock (taken and released in a subtransaction) then fails with 40001
-- when either changed since the snapshot, so a writer whose snapshot predates a new grant is
-- refused (S4 at every isolation level). At READ COMMITTED every statement reads the newest.
-- A caller whose transaction is this one statement may pass hold_lock false: no lock, no write.
CREATE OR REPLACE FUNCTION fencing.try_admit(resource text, term bigint, hold_lock boolean DEFAULT true)
RETURNS fencing.admission
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_resource ALIAS FOR resource;
    p_term     ALIAS FOR term;
    fence_     fencing.fences;
    lease_     fencing.leases;
    max_       bigint;
    key_       text;
    refusal_   text;
    lease_term_ bigint;
    snapshot_  boolean := current_setting('transaction_isolation') <> 'read committed';
BEGIN
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_term(p_term);

    FOR attempt IN 1..3 LOOP
        -- A plain read first: a refusal needs no lock, because the maximum never decreases.
        SELECT * INTO fence_ FROM fencing.fences f WHERE f.resource = p_resource;
        IF NOT FOUND THEN
            -- First write ever to an unbound resource (a protected table's fence exists from
            -- fencing.protect on, and a bound one from fencing.bind).
            PERFORM fencing.check_unreserved(p_resource);
            PERFORM fencing.commit_durably();
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
            IF FOUND AND snapshot_ AND hold_lock THEN
                PERFORM fencing.probe_newest('leases', fence_.lease_key);
            END IF;
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

        IF NOT hold_lock THEN
            IF p_term = fence_.max_term THEN
                RETURN (true, 'admitted', p_term, fence_.lease_key, lease_.term)::fencing.admission;
            END IF;
        ELSIF p_term = fence_.max_term THEN
            -- Hold the row until commit; a raise in progress is waited for, then seen.
            SELECT f.max_term, f.lease_key INTO max_, key_ FROM fencing.fences f
             WHERE f.resource = p_resource FOR KEY SHARE;
            IF snapshot_ THEN
                PERFORM fencing.probe_newest('fences', p_resource);
            END IF;
            IF max_ <> p_term THEN
                -- (The lease's term as read only if the binding is still the one read.)
                RETURN (false, 'stale', max_, key_,
                        CASE WHEN key_ IS NOT DISTINCT FROM fence_.lease_key THEN lease_.term END)::fencing.admission;
            END IF;
            IF key_ IS DISTINCT FROM fence_.lease_key THEN
                CONTINUE; -- bound or rebound while it waited: decide again on the new binding
            END IF;
            -- The lock may have waited for a raise that then rolled back: the lease is checked
            -- again (at REPEATABLE READ and above, a lease changed since the snapshot fails).
            IF fence_.lease_key IS NOT NULL THEN
                SELECT r.reason, r.lease_term INTO refusal_, lease_term_
                  FROM fencing.lease_refusal(fence_.lease_key, p_term, snapshot_) r;
                IF refusal_ IS NOT NULL THEN
                    RETURN (false, refusal_, max_, fence_.lease_key, lease_term_)::fencing.admission;
                END IF;
            END IF;
            RETURN (true, 'admitted', p_term, fence_.lease_key, lease_.term)::fencing.admission;
        END IF;

        -- A higher term: lock the newest version of the row (waiting for every open writer of
        -- the lower term), then raise the maximum. Gateway writes of the lower terms may still be
        -- on their way to an upstream: the new term's gateway writes settle behind them (S5).
        SELECT * INTO fence_ FROM fencing.fences f WHERE f.resource = p_resource FOR UPDATE;
        IF fence_.max_term > p_term THEN
            RETURN (false, 'stale', fence_.max_term, fence_.lease_key, lease_.term)::fencing.admission;
        END IF;
        IF fence_.max_term < p_term THEN
            -- Gateways may admit the lower term until their grants end (grants.sql).
            PERFORM fencing.await_grants(fence_);
        END IF;
        -- A bound fence, on the binding of the version locked (a bind or rebind may have come
        -- while this waited): the lease may have moved on while it waited for the row (another
        -- raise to this very term, then committed, included) and the grants. Read again now and
        -- refused if its term is no longer current (as in fencing.gate; at REPEATABLE READ and
        -- above, a lease changed since the snapshot fails the probe with 40001).
        lease_term_ := lease_.term;
        IF fence_.lease_key IS NOT NULL THEN
            SELECT r.reason, r.lease_term INTO refusal_, lease_term_
              FROM fencing.lease_refusal(fence_.lease_key, p_term, snapshot_) r;
            IF refusal_ IS NOT NULL THEN
                RETURN (false, refusal_, fence_.max_term, fence_.lease_key, lease_term_)::fencing.admission;
            END IF;
        END IF;
        IF fence_.max_term < p_term THEN
            PERFORM fencing.commit_durably();
            UPDATE fencing.fences f
               SET max_term = p_term, updated_at = clock_timestamp(),
                   settle_ms = fencing.next_settle(fence_), settle_id = nextval('fencing.settle_ids'),
                   forward_ms = NULL, grant_ms = NULL, drain_ms = NULL
             WHERE f.resource = p_resource;
        END IF;
        RETURN (true, 'admitted', p_term, fence_.lease_key, lease_term_)::fencing.admission;
    END LOOP;
    RAISE EXCEPTION 'fencing: the fence of "%" kept changing', p_resource USING ERRCODE = '40001';
END
$$;
