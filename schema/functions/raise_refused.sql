-- Raises SQLSTATE ZF409 for a refused admission, naming resource, presented and current term,
-- with a message and a HINT that say what is true of this outcome:
--   stale       a newer term exists for the resource (admitted, or granted to its bound lease);
--   future_term the term is above the bound lease's current term: it was never granted;
--   not_leader  the bound lease is not held right now (expired or released).
CREATE OR REPLACE FUNCTION fencing.raise_refused(resource text, presented_term bigint, decision fencing.admission)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    current_ bigint := CASE
        WHEN decision.lease_key IS NOT NULL THEN coalesce(decision.lease_term, decision.max_term)
        ELSE decision.max_term
    END;
    what_ text;
    hint_ text;
BEGIN
    CASE decision.outcome
        WHEN 'stale' THEN
            what_ := 'stale term';
            hint_ := CASE WHEN decision.lease_key IS NOT NULL
                          THEN format('lease %s has granted a newer term; this writer''s period is over: stop acting as leader',
                                      decision.lease_key)
                          ELSE 'a newer term has been admitted for this resource; this writer''s period is over: stop acting as leader' END;
        WHEN 'future_term' THEN
            what_ := 'future term';
            hint_ := format('the term is above the current term of lease %s, so it was never granted: check where the writer got it',
                            decision.lease_key);
        WHEN 'not_leader' THEN
            what_ := 'not leader';
            hint_ := format('lease %s is not held right now (expired or released): no writer may write until a leader acquires it',
                            decision.lease_key);
        ELSE
            what_ := replace(decision.outcome, '_', ' ');
            hint_ := NULL;
    END CASE;
    PERFORM nextval('fencing.sql_refusals'); -- counted even though this transaction rolls back
    RAISE EXCEPTION 'fencing: write to resource "%" refused (%): presented term %, current term %',
        resource, what_, coalesce(presented_term::text, 'none'), coalesce(current_::text, 'none')
        USING ERRCODE = 'ZF409',
              DETAIL = format('outcome=%s resource=%s presented_term=%s current_term=%s',
                              decision.outcome, resource,
                              coalesce(presented_term::text, 'null'), coalesce(current_::text, 'null')),
              HINT = hint_;
END
$$;
