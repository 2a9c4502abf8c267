-- Raises a fence's maximum by hand after an incident, so that every writer below `term` is
-- refused from now on, and records it. A fence never goes back (S3): a term at or below the
-- maximum is refused with 22023. Gateway writes of the new term settle behind the old term's (fencing.next_settle).
-- A bound fence at its lease's current term waits out every grant on the lease's resources at
-- that term, and its lease gets a new fence epoch (fencing.await_admin_grants, lease grants).
CREATE OR REPLACE FUNCTION fencing.advance_fence(resource text, term bigint, actor text, reason text)
RETURNS fencing.fences
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_resource ALIAS FOR resource;
    p_term     ALIAS FOR term;
    old_       fencing.fences;
    new_       fencing.fences;
    lease_     fencing.leases;
    locked_    record;
BEGIN
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_term(p_term);
    PERFORM fencing.check_name('actor', actor);
    PERFORM fencing.check_name('reason', reason);
    PERFORM fencing.commit_durably();
    SELECT * INTO locked_ FROM fencing.lock_for_admin(p_resource);
    old_ := locked_.fence_;
    lease_ := locked_.lease_;
    IF old_.resource IS NULL THEN
        PERFORM fencing.check_unreserved(p_resource);
        INSERT INTO fencing.fences AS f (resource, max_term, lease_key, updated_at)
        VALUES (p_resource, p_term, NULL, clock_timestamp())
        RETURNING * INTO new_;
    ELSIF p_term <= old_.max_term THEN
        RAISE EXCEPTION 'fencing: a fence never goes back: "%" is at term %, asked for %',
            p_resource, old_.max_term, p_term
            USING ERRCODE = '22023';
    ELSE
        PERFORM fencing.await_admin_grants(old_, lease_);
        UPDATE fencing.fences f
           SET max_term = p_term, updated_at = clock_timestamp(),
               settle_ms = fencing.next_settle(old_), settle_id = nextval('fencing.settle_ids'),
               forward_ms = NULL, grant_ms = NULL, drain_ms = NULL
         WHERE f.resource = p_resource
        RETURNING * INTO new_;
    END IF;
    INSERT INTO fencing.admin_audit (actor, action, target, reason, before, after)
    VALUES (actor, 'advance_fence', p_resource, reason, to_jsonb(old_), to_jsonb(new_));
    RETURN new_;
END
$$;
