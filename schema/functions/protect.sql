-- Attaches fencing.guard to an existing table in one statement: every INSERT, UPDATE, DELETE
-- and TRUNCATE must then present a term that fencing.admit accepts for resource. It covers the
-- table's partitions and inheritance children, present ones now and later ones through the
-- event trigger fencing_protect_children (installed when the migrations run as a superuser;
-- without it, run fencing.protect again after adding a partition or child). The triggers fire
-- in every session_replication_role (ENABLE ALWAYS). It creates the resource's fence (unbound,
-- maximum 0) when there is none, so no gateway route can bind it to a lease later.
-- Runs with the caller's rights: only the table's owner can protect it.
CREATE OR REPLACE FUNCTION fencing.protect(tbl regclass, resource text, term_column text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_resource ALIAS FOR resource;
    type_      regtype;
    rel_       regclass;
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION 'fencing: table must not be null' USING ERRCODE = '22023';
    END IF;
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_bindable(p_resource);
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
    PERFORM fencing.create_fence(p_resource);
    -- The DDL below must not wake the event trigger for this same tree.
    PERFORM set_config('fencing.protecting', 'on', true);
    PERFORM fencing.protect_tree(tbl, p_resource, term_column);
    PERFORM set_config('fencing.protecting', 'off', true);
END
$$;

-- Guards a table and every descendant, parents before children.
CREATE OR REPLACE FUNCTION fencing.protect_tree(tbl regclass, resource text, term_column text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    rel_ regclass;
BEGIN
    FOR rel_ IN
        WITH RECURSIVE tree(relid, depth) AS (
            SELECT tbl::oid, 0
            UNION ALL
            SELECT i.inhrelid, t.depth + 1 FROM pg_inherits i JOIN tree t ON i.inhparent = t.relid
        )
        SELECT relid::regclass FROM tree GROUP BY relid ORDER BY min(depth)
    LOOP
        PERFORM fencing.protect_one(rel_, resource, term_column);
    END LOOP;
END
$$;

-- Guards one relation of a protected tree. A partition of a guarded partitioned table gets
-- the row trigger from it (Postgres clones row triggers to partitions), so it gets only the
-- TRUNCATE trigger of its own; a partition protected by itself (its parent is not), and an
-- inheritance child, get both. A partitioned table first drops the row triggers its
-- partitions have of their own (protected by themselves before), which its clones replace.
CREATE OR REPLACE FUNCTION fencing.protect_one(rel regclass, resource text, term_column text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cloned_ boolean;
    args_   text;
    part_   regclass;
BEGIN
    -- NULL: no row trigger; true: a clone of its partitioned parent's; false: its own.
    SELECT t.tgparentid <> 0 INTO cloned_ FROM pg_trigger t WHERE t.tgrelid = rel AND t.tgname = 'fencing_guard';
    args_ := CASE WHEN term_column IS NULL THEN format('%L', resource)
                  ELSE format('%L, %L', resource, term_column) END;
    IF cloned_ IS DISTINCT FROM true THEN
        IF cloned_ = false THEN
            EXECUTE format('DROP TRIGGER fencing_guard ON %s', rel);
        END IF;
        FOR part_ IN
            SELECT p.relid::regclass FROM pg_partition_tree(rel) p
              JOIN pg_trigger t ON t.tgrelid = p.relid AND t.tgname = 'fencing_guard' AND t.tgparentid = 0
             WHERE p.relid <> rel::oid
        LOOP
            EXECUTE format('DROP TRIGGER fencing_guard ON %s', part_);
        END LOOP;
        EXECUTE format('CREATE TRIGGER fencing_guard BEFORE INSERT OR UPDATE OR DELETE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION fencing.guard(%s)', rel, args_);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = rel AND t.tgname = 'fencing_guard') THEN
        EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER fencing_guard', rel);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = rel AND t.tgname = 'fencing_guard_truncate') THEN
        EXECUTE format('DROP TRIGGER fencing_guard_truncate ON %s', rel);
    END IF;
    EXECUTE format('CREATE TRIGGER fencing_guard_truncate BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION fencing.guard(%L)', rel, resource);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER fencing_guard_truncate', rel);
END
$$;

-- Creates an unbound fence at maximum 0 for a protected table's resource, if it has none.
CREATE OR REPLACE FUNCTION fencing.create_fence(resource text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM fencing.check_name('resource', resource);
    PERFORM fencing.check_bindable(resource);
    PERFORM fencing.check_unreserved(resource);
    PERFORM fencing.commit_durably();
    INSERT INTO fencing.fences (resource, max_term, lease_key, updated_at)
    VALUES (resource, 0, NULL, clock_timestamp())
    ON CONFLICT ON CONSTRAINT fences_pkey DO NOTHING;
END
$$;

-- The event trigger's function: after CREATE TABLE or ALTER TABLE (a new partition or child,
-- ATTACH PARTITION, INHERIT), guards every relation below a protected ancestor.
CREATE OR REPLACE FUNCTION fencing.protect_children()
RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    command_ record;
    root_    record;
BEGIN
    IF current_setting('fencing.protecting', true) = 'on' THEN
        RETURN; -- the DDL of protect itself
    END IF;
    PERFORM set_config('fencing.protecting', 'on', true);
    FOR command_ IN SELECT DISTINCT c.objid FROM pg_event_trigger_ddl_commands() c
                     WHERE c.object_type IN ('table', 'table column') AND c.classid = 'pg_class'::regclass LOOP
        -- The table's protected ancestors (itself included), each guarded as it was protected.
        FOR root_ IN
            WITH RECURSIVE up(relid) AS (
                SELECT command_.objid
                UNION
                SELECT i.inhparent FROM pg_inherits i JOIN up u ON i.inhrelid = u.relid
            )
            SELECT t.tgrelid::regclass AS rel, encode(t.tgargs, 'escape') AS args, t.tgnargs
              FROM up JOIN pg_trigger t ON t.tgrelid = up.relid AND t.tgname = 'fencing_guard'
              WHERE NOT t.tgisinternal AND t.tgparentid = 0
        LOOP
            PERFORM fencing.protect_tree(root_.rel, split_part(root_.args, E'\\000', 1),
                                         nullif(split_part(root_.args, E'\\000', 2), ''));
        END LOOP;
    END LOOP;
    PERFORM set_config('fencing.protecting', 'off', true);
END
$$;
