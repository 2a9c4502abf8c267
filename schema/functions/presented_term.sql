-- The term a guarded write presents: the transaction setting fencing.token when set,
-- otherwise the row's term column (for UPDATE only when the update changes it).
-- Returns NULL when the write presents no term.
CREATE OR REPLACE FUNCTION fencing.presented_term(op text, new_row jsonb, old_row jsonb, term_column text)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    token text := current_setting('fencing.token', true);
    value text;
BEGIN
    IF token IS NOT NULL AND btrim(token) <> '' THEN
        IF btrim(token) !~ '^[0-9]{1,19}$' OR btrim(token)::numeric > 9223372036854775807 THEN
            RAISE EXCEPTION 'fencing: the setting fencing.token must be a decimal integer in 1..9223372036854775807, got "%"', token
                USING ERRCODE = '22023';
        END IF;
        RETURN btrim(token)::bigint;
    END IF;
    IF term_column IS NULL OR op NOT IN ('INSERT', 'UPDATE') THEN
        RETURN NULL;
    END IF;
    IF op = 'UPDATE' AND (new_row -> term_column) IS NOT DISTINCT FROM (old_row -> term_column) THEN
        RETURN NULL; -- unchanged: the update inherits an older writer's term and presents none
    END IF;
    value := new_row ->> term_column;
    RETURN value::bigint;
END
$$;
