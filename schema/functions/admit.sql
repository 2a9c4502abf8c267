-- Admits a write of term to resource, or raises SQLSTATE ZF409.
-- Returns the resource's maximum after the call. Inside a transaction, the fence row stays
-- locked until the transaction ends, so no higher term can slip in before this one commits.
CREATE OR REPLACE FUNCTION fencing.admit(resource text, term bigint)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    decision fencing.admission;
BEGIN
    decision := fencing.try_admit(resource, term, true);
    IF NOT decision.admitted THEN
        PERFORM fencing.raise_refused(resource, term, decision);
    END IF;
    RETURN decision.max_term;
END
$$;
