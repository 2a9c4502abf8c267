-- Raises SQLSTATE ZF409 for a refused admission, naming resource, presented and current term.
CREATE OR REPLACE FUNCTION fencing.raise_refused(resource text, presented_term bigint, decision fencing.admission)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    current_ bigint := CASE
        WHEN decision.lease_key IS NOT NULL THEN coalesce(decision.lease_term, decision.max_term)
        ELSE decision.max_term
    END;
BEGIN
    RAISE EXCEPTION 'fencing: % write to resource "%" refused: presented term %, current term %',
        replace(decision.outcome, '_', ' '), resource,
        coalesce(presented_term::text, 'none'), coalesce(current_::text, 'none')
        USING ERRCODE = 'ZF409',
              DETAIL = format('outcome=%s resource=%s presented_term=%s current_term=%s',
                              decision.outcome, resource,
                              coalesce(presented_term::text, 'null'), coalesce(current_::text, 'null')),
              HINT = 'a newer leader holds this resource; this writer must stop acting as leader';
END
$$;
