-- Binds a resource to a lease key: from then on only that lease's current term, while the
-- lease is held, is admitted for the resource (invariant S4). Returns the resource's maximum.
CREATE OR REPLACE FUNCTION fencing.bind(resource text, lease_key text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    p_resource  ALIAS FOR resource;
    p_lease_key ALIAS FOR lease_key;
    max_        bigint;
BEGIN
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_name('lease key', p_lease_key);

    INSERT INTO fencing.fences AS f (resource, max_term, lease_key, updated_at)
    VALUES (p_resource, 0, p_lease_key, clock_timestamp())
    ON CONFLICT ON CONSTRAINT fences_pkey DO UPDATE
       SET lease_key = excluded.lease_key, updated_at = excluded.updated_at
     WHERE f.lease_key IS DISTINCT FROM excluded.lease_key
    RETURNING f.max_term INTO max_;
    IF NOT FOUND THEN
        SELECT f.max_term INTO max_ FROM fencing.fences f WHERE f.resource = p_resource;
    END IF;
    RETURN max_;
END
$$;
