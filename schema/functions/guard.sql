-- The trigger function fencing.protect attaches: refuses stale writes inside Postgres.
-- Arguments: resource, then optionally the name of the term column.
--
-- It runs with its owner's rights (a guarded writer needs no privilege on fencing.*) and a
-- pinned search_path (a writer's own clock_timestamp() cannot stand in for the real one).
-- A token set for the session with SET (not SET LOCAL) would be a token for every later
-- transaction of the connection, the next user of a pooled connection included: the guard
-- uses it for the transaction at hand and leaves the session's value empty when that
-- transaction commits (a transaction-local value on top of an emptied session value).
CREATE OR REPLACE FUNCTION fencing.guard()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    resource_    text := TG_ARGV[0];
    term_column_ text := CASE WHEN TG_NARGS > 1 THEN TG_ARGV[1] END;
    new_json     jsonb;
    old_json     jsonb;
    term_        bigint;
    token_       text := current_setting('fencing.token', true);
BEGIN
    IF coalesce(btrim(token_), '') <> '' THEN
        PERFORM set_config('fencing.token', '', false);
        PERFORM set_config('fencing.token', token_, true);
    END IF;
    IF TG_LEVEL = 'ROW' AND TG_OP IN ('INSERT', 'UPDATE') THEN
        new_json := to_jsonb(NEW);
    END IF;
    IF TG_LEVEL = 'ROW' AND TG_OP IN ('UPDATE', 'DELETE') THEN
        old_json := to_jsonb(OLD);
    END IF;
    term_ := fencing.presented_term(TG_OP, new_json, old_json,
                                    CASE WHEN TG_LEVEL = 'ROW' THEN term_column_ END);
    IF term_ IS NULL THEN
        PERFORM nextval('fencing.sql_refusals'); -- counted even though this transaction rolls back
        RAISE EXCEPTION 'fencing: % on %.% presents no term for resource "%"%',
            TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME, resource_,
            CASE WHEN term_column_ IS NOT NULL AND TG_OP = 'DELETE'
                 THEN ' (a DELETE, or an UPDATE that moves a row to another partition, presents its term only with SET LOCAL fencing.token)'
                 ELSE '' END
            USING ERRCODE = 'ZF409',
                  DETAIL = format('outcome=missing_token resource=%s presented_term=null current_term=%s',
                                  resource_,
                                  coalesce((SELECT f.max_term::text FROM fencing.fences f WHERE f.resource = resource_), 'null')),
                  HINT = 'SET LOCAL fencing.token to the writer''s term (or set_config(''fencing.token'', $1, true))'
                         || CASE WHEN term_column_ IS NOT NULL AND TG_OP <> 'DELETE'
                                 THEN format(', or set the column %I', term_column_) ELSE '' END;
    END IF;

    PERFORM fencing.admit(resource_, term_);

    IF TG_LEVEL = 'STATEMENT' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    IF term_column_ IS NOT NULL THEN
        NEW := jsonb_populate_record(NEW, jsonb_build_object(term_column_, term_));
    END IF;
    RETURN NEW;
END
$$;
