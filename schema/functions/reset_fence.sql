-- The one way a fence goes back: recovers an unbound fence that a client poisoned with a term
-- no real leader will reach (for instance 9223372036854775807 through an unbound gateway
-- route, which trusts its clients' tokens). It sets the maximum to `term`, which breaks S3 for
-- this resource at this instant by design, and records it in fencing.admin_audit. Stop the
-- poisoning client first. Writes admitted afterwards settle behind every write the poisoned
-- term may still have in flight (S5). Bound fences cannot be poisoned (only the lease's current
-- term is admitted) and are refused here.
CREATE OR REPLACE FUNCTION fencing.reset_fence(resource text, term bigint, actor text, reason text)
RETURNS fencing.fences
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_resource ALIAS FOR resource;
    p_term     ALIAS FOR term;
    old_       fencing.fences;
    new_       fencing.fences;
BEGIN
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_term(p_term);
    PERFORM fencing.check_name('actor', actor);
    PERFORM fencing.check_name('reason', reason);
    PERFORM fencing.commit_durably();
    SELECT * INTO old_ FROM fencing.fences f WHERE f.resource = p_resource FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fencing: no fence "%"', p_resource USING ERRCODE = '22023';
    END IF;
    IF old_.lease_key IS NOT NULL THEN
        RAISE EXCEPTION 'fencing: fence "%" is bound to lease "%": only unbound fences can be reset',
            p_resource, old_.lease_key
            USING ERRCODE = '22023';
    END IF;
    PERFORM fencing.await_grants(old_);
    UPDATE fencing.fences f
       SET max_term = p_term, updated_at = clock_timestamp(),
           settle_ms = fencing.next_settle(old_), settle_id = nextval('fencing.settle_ids'),
           forward_ms = NULL, grant_ms = NULL, drain_ms = NULL
     WHERE f.resource = p_resource
    RETURNING * INTO new_;
    INSERT INTO fencing.admin_audit (actor, action, target, reason, before, after)
    VALUES (actor, 'reset_fence', p_resource, reason, to_jsonb(old_), to_jsonb(new_));
    RETURN new_;
END
$$;
