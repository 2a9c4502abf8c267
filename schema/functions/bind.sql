-- Binds a resource to a lease key: from then on only that lease's current term, while the
-- lease is held, is admitted for the resource (invariant S4). Returns the resource's maximum.
-- Binds a resource that is not bound yet (new, or a protected table's); a resource bound to
-- another lease is refused: rebinding is the audited admin action fencing.rebind.
CREATE OR REPLACE FUNCTION fencing.bind(resource text, lease_key text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_resource  ALIAS FOR resource;
    p_lease_key ALIAS FOR lease_key;
    fence_      fencing.fences;
BEGIN
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_bindable(p_resource);
    PERFORM fencing.check_unreserved(p_resource);
    PERFORM fencing.check_name('lease key', p_lease_key);

    PERFORM fencing.commit_durably();
    INSERT INTO fencing.fences AS f (resource, max_term, lease_key, updated_at)
    VALUES (p_resource, 0, p_lease_key, clock_timestamp())
    ON CONFLICT ON CONSTRAINT fences_pkey DO NOTHING;
    SELECT * INTO fence_ FROM fencing.fences f WHERE f.resource = p_resource FOR UPDATE;
    IF fence_.lease_key IS NULL THEN
        -- Unbound grants on it admit any writer of its term: they end first.
        PERFORM fencing.await_grants(fence_);
        UPDATE fencing.fences f SET lease_key = p_lease_key, updated_at = clock_timestamp(), grant_ms = NULL,
                                    settle_id = nextval('fencing.settle_ids')
         WHERE f.resource = p_resource;
    ELSIF fence_.lease_key <> p_lease_key THEN
        RAISE EXCEPTION 'fencing: resource "%" is bound to lease "%"; rebinding it to "%" is an audited admin action: fencing.rebind(resource, lease_key, actor, reason)',
            p_resource, fence_.lease_key, p_lease_key
            USING ERRCODE = '22023';
    END IF;
    RETURN fence_.max_term;
END
$$;

-- Rebinds a resource to another lease after an incident or a migration, and records it in
-- fencing.admin_audit. The maximum stays: the new lease's leader is refused until its term
-- reaches it. Writes of the new binding settle behind the old binding's (S5, fencing.next_settle).
-- A fence at its old lease's current term waits out every grant on that lease's resources at that
-- term, and the old lease gets a new fence epoch (fencing.await_admin_grants, lease grants).
CREATE OR REPLACE FUNCTION fencing.rebind(resource text, lease_key text, actor text, reason text)
RETURNS fencing.fences
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_resource  ALIAS FOR resource;
    p_lease_key ALIAS FOR lease_key;
    old_        fencing.fences;
    new_        fencing.fences;
    lease_      fencing.leases;
    locked_     record;
BEGIN
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_bindable(p_resource);
    PERFORM fencing.check_name('lease key', p_lease_key);
    PERFORM fencing.check_name('actor', actor);
    PERFORM fencing.check_name('reason', reason);
    PERFORM fencing.commit_durably();
    SELECT * INTO locked_ FROM fencing.lock_for_admin(p_resource);
    old_ := locked_.fence_;
    lease_ := locked_.lease_;
    IF old_.resource IS NULL THEN
        RAISE EXCEPTION 'fencing: no fence "%"; use fencing.bind for a new resource', p_resource
            USING ERRCODE = '22023';
    END IF;
    PERFORM fencing.await_admin_grants(old_, lease_);
    UPDATE fencing.fences f
       SET lease_key = p_lease_key, updated_at = clock_timestamp(),
           settle_ms = fencing.next_settle(old_), settle_id = nextval('fencing.settle_ids'),
           forward_ms = NULL, grant_ms = NULL, drain_ms = NULL
     WHERE f.resource = p_resource
    RETURNING * INTO new_;
    INSERT INTO fencing.admin_audit (actor, action, target, reason, before, after)
    VALUES (actor, 'rebind', p_resource, reason, to_jsonb(old_), to_jsonb(new_));
    RETURN new_;
END
$$;
