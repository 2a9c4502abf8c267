-- Many gateway decisions in one statement, one result row per item in input order: item i is
-- fencing.gate_lease(resources[i], lease_keys[i], owners[i], ...) when lease_keys[i] is set,
-- else fencing.gate(resources[i], terms[i], ...). A gateway batches the decisions of concurrent
-- writes into one round trip; it sorts items by resource, so concurrent batches lock in one order.
CREATE OR REPLACE FUNCTION fencing.gate_many(resources text[], terms bigint[], lease_keys text[], owners text[],
                                             bind_leases text[], forward_timeout interval,
                                             grant_for interval DEFAULT interval '0')
RETURNS SETOF fencing.gate_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF coalesce(array_length(resources, 1), 0) <> coalesce(array_length(terms, 1), 0)
       OR coalesce(array_length(resources, 1), 0) <> coalesce(array_length(lease_keys, 1), 0)
       OR coalesce(array_length(resources, 1), 0) <> coalesce(array_length(owners, 1), 0)
       OR coalesce(array_length(resources, 1), 0) <> coalesce(array_length(bind_leases, 1), 0) THEN
        RAISE EXCEPTION 'fencing: gate_many needs arrays of one length' USING ERRCODE = '22023';
    END IF;
    FOR i IN 1..coalesce(array_length(resources, 1), 0) LOOP
        IF lease_keys[i] IS NOT NULL THEN
            RETURN NEXT fencing.gate_lease(resources[i], lease_keys[i], owners[i], forward_timeout, bind_leases[i], grant_for);
        ELSE
            RETURN NEXT fencing.gate(resources[i], terms[i], forward_timeout, bind_leases[i], grant_for);
        END IF;
    END LOOP;
END
$$;
