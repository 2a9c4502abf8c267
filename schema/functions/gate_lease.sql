-- The gateway's stamp mode: the write's term is lease_key's current term, when owner holds that
-- lease unexpired; otherwise the write is refused as not_leader. On a route bound to that lease,
-- a grant (grant_for > 0) covers the resource at that term: the gateway keeps it for this lease
-- and owner only.
CREATE OR REPLACE FUNCTION fencing.gate_lease(resource text, lease_key text, owner text,
                                              forward_timeout interval, bind_lease text DEFAULT NULL,
                                              grant_for interval DEFAULT interval '0')
RETURNS fencing.gate_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_resource  ALIAS FOR resource;
    p_lease_key ALIAS FOR lease_key;
    p_owner     ALIAS FOR owner;
    lease_      fencing.leases;
BEGIN
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_name('lease key', p_lease_key);
    PERFORM fencing.check_name('owner', p_owner);
    -- A route bound to one lease is written under that lease only: another lease's term, even
    -- an equal number, says nothing about who leads this one.
    IF bind_lease IS NOT NULL AND bind_lease <> p_lease_key THEN
        RETURN (false, 'wrong_lease', NULL,
                (SELECT f.max_term FROM fencing.fences f WHERE f.resource = p_resource),
                bind_lease, NULL, 0, 0, NULL, NULL)::fencing.gate_result;
    END IF;
    SELECT * INTO lease_ FROM fencing.leases l WHERE l.key = p_lease_key;
    IF NOT FOUND OR lease_.owner <> p_owner OR lease_.expires_at <= clock_timestamp() THEN
        RETURN (false, 'not_leader', NULL,
                (SELECT f.max_term FROM fencing.fences f WHERE f.resource = p_resource),
                p_lease_key, lease_.term, 0, 0, NULL, NULL)::fencing.gate_result;
    END IF;
    -- A grant in stamp mode must end with the owner's hold of the lease: only a bound resource's
    -- grant is capped at its lease's expiry and counted when the lease is released, so an
    -- unbound route's stamp-mode writes get none.
    RETURN fencing.gate(p_resource, lease_.term, forward_timeout, bind_lease,
                        CASE WHEN bind_lease IS NULL THEN interval '0' ELSE grant_for END);
END
$$;
