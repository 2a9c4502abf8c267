-- Appends refused writes (arrays of one length) and keeps only the newest `keep` rows. The
-- record is for review, not for decisions: it commits without waiting for the WAL flush.
CREATE OR REPLACE FUNCTION fencing.record_refusals(resources text[], routes text[], outcomes text[],
                                                   presented_terms bigint[], current_terms bigint[],
                                                   gateway text, keep integer DEFAULT 10000)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF keep IS NULL OR keep < 1 THEN
        RAISE EXCEPTION 'fencing: keep must be at least 1' USING ERRCODE = '22023';
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO fencing.refusals (resource, route, outcome, presented_term, current_term, gateway)
    SELECT r, ro, o, p, c, gateway
      FROM unnest(resources, routes, outcomes, presented_terms, current_terms) AS t(r, ro, o, p, c)
     WHERE r IS NOT NULL AND o IS NOT NULL;
    DELETE FROM fencing.refusals WHERE id <= (SELECT max(id) - keep FROM fencing.refusals);
END
$$;
