-- Attaches fencing.guard to an existing table in one statement: every INSERT, UPDATE, DELETE
-- and TRUNCATE must then present a term that fencing.admit accepts for resource.
CREATE OR REPLACE FUNCTION fencing.protect(tbl regclass, resource text, term_column text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    p_resource ALIAS FOR resource;
    type_      regtype;
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION 'fencing: table must not be null' USING ERRCODE = '22023';
    END IF;
    PERFORM fencing.check_name('resource', p_resource);
    IF term_column IS NOT NULL THEN
        SELECT a.atttypid::regtype INTO type_
          FROM pg_attribute a
         WHERE a.attrelid = tbl AND a.attname = term_column AND a.attnum > 0 AND NOT a.attisdropped;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'fencing: table % has no column "%"', tbl, term_column
                USING ERRCODE = '22023';
        END IF;
        IF type_ NOT IN ('bigint'::regtype, 'integer'::regtype) THEN
            RAISE EXCEPTION 'fencing: term column %.% must be bigint, got %', tbl, term_column, type_
                USING ERRCODE = '22023';
        END IF;
    END IF;

    EXECUTE format('DROP TRIGGER IF EXISTS fencing_guard ON %s', tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS fencing_guard_truncate ON %s', tbl);
    IF term_column IS NULL THEN
        EXECUTE format('CREATE TRIGGER fencing_guard BEFORE INSERT OR UPDATE OR DELETE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION fencing.guard(%L)', tbl, p_resource);
    ELSE
        EXECUTE format('CREATE TRIGGER fencing_guard BEFORE INSERT OR UPDATE OR DELETE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION fencing.guard(%L, %L)', tbl, p_resource, term_column);
    END IF;
    EXECUTE format('CREATE TRIGGER fencing_guard_truncate BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION fencing.guard(%L)', tbl, p_resource);
END
$$;
