-- Appends refused writes (arrays of one length) and keeps only the newest `keep` rows. The
-- record is for review, not for decisions: it commits without waiting for the WAL flush.
DO $$
BEGIN
    IF to_regprocedure('fencing.record_refusals(text[], text[], text[], bigint[], bigint[], text, integer)') IS NOT NULL THEN
        DROP FUNCTION fencing.record_refusals(text[], text[], text[], bigint[], bigint[], text, integer);
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION fencing.record_refusals(resources text[], routes text[], outcomes text[],
                                                   presented_terms bigint[], current_terms bigint[],
                                                   client_addrs text[], request_ids text[],
                                                   gateway text, keep integer DEFAULT 10000)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF keep IS NULL OR keep < 1 THEN
        RAISE EXCEPTION 'fencing: keep must be at least 1' USING ERRCODE = '22023';
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO fencing.refusals (resource, route, outcome, presented_term, current_term, client_addr, request_id, gateway)
    SELECT r, ro, o, p, c, a, q, gateway
      FROM unnest(resources, routes, outcomes, presented_terms, current_terms, client_addrs, request_ids)
           AS t(r, ro, o, p, c, a, q)
     WHERE r IS NOT NULL AND o IS NOT NULL;
    DELETE FROM fencing.refusals WHERE id <= (SELECT max(id) - keep FROM fencing.refusals);
END
$$;

-- The same with who was refused (schema version 15): the lease the resource is bound to or the
-- stamp-mode lease, the stamp-mode owner, and the authenticated client (NULL where none applies).
CREATE OR REPLACE FUNCTION fencing.record_refusals(resources text[], routes text[], outcomes text[],
                                                   presented_terms bigint[], current_terms bigint[],
                                                   client_addrs text[], request_ids text[],
                                                   lease_keys text[], owners text[], callers text[],
                                                   gateway text, keep integer DEFAULT 10000)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF keep IS NULL OR keep < 1 THEN
        RAISE EXCEPTION 'fencing: keep must be at least 1' USING ERRCODE = '22023';
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO fencing.refusals (resource, route, outcome, presented_term, current_term, client_addr, request_id,
                                  lease_key, owner, caller, gateway)
    SELECT r, ro, o, p, c, a, q, l, w, k, gateway
      FROM unnest(resources, routes, outcomes, presented_terms, current_terms, client_addrs, request_ids,
                  lease_keys, owners, callers)
           AS t(r, ro, o, p, c, a, q, l, w, k)
     WHERE r IS NOT NULL AND o IS NOT NULL;
    DELETE FROM fencing.refusals WHERE id <= (SELECT max(id) - keep FROM fencing.refusals);
END
$$;

-- How many writes Postgres itself refused (fencing.admit, the guard) since the schema was
-- installed: the non-transactional counter fencing.sql_refusals, which survives the rollback
-- of the refused transaction.
CREATE OR REPLACE FUNCTION fencing.sql_refusal_count()
RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM fencing.sql_refusals
$$;
