-- fencing-gateway schema, version 1: leases, fences, and the functions that decide.
--
-- Apply with psql in one transaction:
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 --single-transaction -f 0001_init.sql
-- or let `fencing-gateway migrate --database-url URL` apply every pending file in order.
--
-- Every refused write raises SQLSTATE ZF409 (class ZF, implementation-defined, "fencing").
-- Every invalid argument raises SQLSTATE 22023 (invalid_parameter_value).
-- Expiry is decided by this database's clock only (clock_timestamp()).

CREATE SCHEMA IF NOT EXISTS fencing;

-- Which migration files have been applied. Each file records itself in its last statement,
-- so a file applied by hand with psql is known to the embedded runner too.
CREATE TABLE IF NOT EXISTS fencing.schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per election. The row is never deleted, so a term is never reused.
CREATE TABLE IF NOT EXISTS fencing.leases (
    key         text        PRIMARY KEY,
    owner       text        NOT NULL,
    term        bigint      NOT NULL CHECK (term >= 1),
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);

COMMENT ON TABLE fencing.leases IS
    'One row per lease key; owner is the last holder, who holds it while expires_at is in the future by the database clock.';
COMMENT ON COLUMN fencing.leases.term IS
    'The fencing token: grows by exactly one each time a new leadership period starts.';

-- One row per resource: the highest term admitted for it, and the lease it is bound to.
CREATE TABLE IF NOT EXISTS fencing.fences (
    resource   text        PRIMARY KEY,
    max_term   bigint      NOT NULL CHECK (max_term >= 0),
    lease_key  text        NULL,
    updated_at timestamptz NOT NULL
);

COMMENT ON COLUMN fencing.fences.max_term IS
    'The highest term ever admitted for this resource; 0 when bound but nothing admitted yet. Never decreases.';
COMMENT ON COLUMN fencing.fences.lease_key IS
    'When set, only the current term of this lease, while held, is admitted (invariant S4).';

-- The result row of acquire and renew.
DO $$
BEGIN
    IF to_regtype('fencing.lease_result') IS NULL THEN
        CREATE TYPE fencing.lease_result AS (
            ok           boolean,
            holder       text,
            term         bigint,
            expires_at   timestamptz,
            remaining_ms bigint
        );
    END IF;
END
$$;

-- The result row of try_admit: the decision without raising.
DO $$
BEGIN
    IF to_regtype('fencing.admission') IS NULL THEN
        CREATE TYPE fencing.admission AS (
            admitted     boolean,
            -- admitted, stale, future_term, not_leader
            outcome      text,
            max_term     bigint,
            lease_key    text,
            lease_term   bigint
        );
    END IF;
END
$$;

-- The longest lease a caller may ask for.
CREATE OR REPLACE FUNCTION fencing.max_ttl() RETURNS interval
LANGUAGE sql IMMUTABLE AS $$ SELECT interval '1 hour' $$;

-- Refuses a null, empty or overlong name with SQLSTATE 22023.
CREATE OR REPLACE FUNCTION fencing.check_name(what text, value text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL OR value = '' THEN
        RAISE EXCEPTION 'fencing: % must not be null or empty', what
            USING ERRCODE = '22023';
    END IF;
    IF length(value) > 256 THEN
        RAISE EXCEPTION 'fencing: % must be at most 256 characters, got %', what, length(value)
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- Refuses a null, non-positive or overlong ttl with SQLSTATE 22023.
CREATE OR REPLACE FUNCTION fencing.check_ttl(ttl interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF ttl IS NULL OR ttl <= interval '0' THEN
        RAISE EXCEPTION 'fencing: ttl must be positive, got %', coalesce(ttl::text, 'null')
            USING ERRCODE = '22023';
    END IF;
    IF ttl > fencing.max_ttl() THEN
        RAISE EXCEPTION 'fencing: ttl must be at most %, got %', fencing.max_ttl(), ttl
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- Refuses a null or non-positive term with SQLSTATE 22023.
CREATE OR REPLACE FUNCTION fencing.check_term(term bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF term IS NULL OR term < 1 THEN
        RAISE EXCEPTION 'fencing: term must be an integer >= 1, got %', coalesce(term::text, 'null')
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- Milliseconds from now_ to expires_at, rounded down, never negative.
CREATE OR REPLACE FUNCTION fencing.remaining_ms(expires_at timestamptz, now_ timestamptz)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(0, floor(extract(epoch FROM (expires_at - now_)) * 1000))::bigint
$$;

-- Acquires the lease for owner, or reports who holds it.
--
-- A new leadership period (the lease was absent, expired or released) gets term + 1.
-- The valid holder acquiring again keeps its term and extends its lease, like a renewal.
CREATE OR REPLACE FUNCTION fencing.acquire(key text, owner text, ttl interval)
RETURNS fencing.lease_result
LANGUAGE plpgsql AS $$
DECLARE
    p_key   ALIAS FOR key;
    p_owner ALIAS FOR owner;
    p_ttl   ALIAS FOR ttl;
    row_    fencing.leases;
    now_    timestamptz;
BEGIN
    PERFORM fencing.check_name('lease key', p_key);
    PERFORM fencing.check_name('owner', p_owner);
    PERFORM fencing.check_ttl(p_ttl);

    SELECT * INTO row_ FROM fencing.leases l WHERE l.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        now_ := clock_timestamp();
        INSERT INTO fencing.leases AS l (key, owner, term, acquired_at, renewed_at, expires_at)
        VALUES (p_key, p_owner, 1, now_, now_, now_ + p_ttl)
        ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING
        RETURNING * INTO row_;
        IF FOUND THEN
            RETURN (true, p_owner, 1::bigint, row_.expires_at,
                    fencing.remaining_ms(row_.expires_at, now_))::fencing.lease_result;
        END IF;
        -- A concurrent caller created the row first: decide against its row.
        SELECT * INTO row_ FROM fencing.leases l WHERE l.key = p_key FOR UPDATE;
    END IF;

    -- The clock is read after the row lock is held, so waiting for the lock never
    -- makes an expired lease look valid.
    now_ := clock_timestamp();
    IF row_.expires_at > now_ AND row_.owner <> p_owner THEN
        RETURN (false, row_.owner, row_.term, row_.expires_at,
                fencing.remaining_ms(row_.expires_at, now_))::fencing.lease_result;
    END IF;

    IF row_.expires_at > now_ THEN
        -- The valid holder again: same period, same term, longer lease.
        UPDATE fencing.leases l
           SET renewed_at = now_, expires_at = now_ + p_ttl
         WHERE l.key = p_key
        RETURNING * INTO row_;
    ELSE
        -- A new leadership period.
        UPDATE fencing.leases l
           SET owner = p_owner, term = l.term + 1,
               acquired_at = now_, renewed_at = now_, expires_at = now_ + p_ttl
         WHERE l.key = p_key
        RETURNING * INTO row_;
    END IF;
    RETURN (true, row_.owner, row_.term, row_.expires_at,
            fencing.remaining_ms(row_.expires_at, now_))::fencing.lease_result;
END
$$;

-- Extends the lease of its valid holder. Fails, changing nothing, for anyone else,
-- and for the last holder once its lease has expired.
CREATE OR REPLACE FUNCTION fencing.renew(key text, owner text, ttl interval)
RETURNS fencing.lease_result
LANGUAGE plpgsql AS $$
DECLARE
    p_key   ALIAS FOR key;
    p_owner ALIAS FOR owner;
    p_ttl   ALIAS FOR ttl;
    row_    fencing.leases;
    now_    timestamptz;
BEGIN
    PERFORM fencing.check_name('lease key', p_key);
    PERFORM fencing.check_name('owner', p_owner);
    PERFORM fencing.check_ttl(p_ttl);

    SELECT * INTO row_ FROM fencing.leases l WHERE l.key = p_key FOR UPDATE;
    now_ := clock_timestamp();
    IF NOT FOUND THEN
        RETURN (false, NULL, NULL, NULL, 0)::fencing.lease_result;
    END IF;
    IF row_.expires_at <= now_ THEN
        RETURN (false, NULL, row_.term, row_.expires_at, 0)::fencing.lease_result;
    END IF;
    IF row_.owner <> p_owner THEN
        RETURN (false, row_.owner, row_.term, row_.expires_at,
                fencing.remaining_ms(row_.expires_at, now_))::fencing.lease_result;
    END IF;

    UPDATE fencing.leases l
       SET renewed_at = now_, expires_at = now_ + p_ttl
     WHERE l.key = p_key
    RETURNING * INTO row_;
    RETURN (true, row_.owner, row_.term, row_.expires_at,
            fencing.remaining_ms(row_.expires_at, now_))::fencing.lease_result;
END
$$;

-- Ends the valid holder's period at once, so a follower can take over without waiting
-- for expiry. The row stays, so the next period gets a new term. Returns false, changing
-- nothing, when owner does not hold the lease.
CREATE OR REPLACE FUNCTION fencing.release(key text, owner text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    p_key   ALIAS FOR key;
    p_owner ALIAS FOR owner;
    row_    fencing.leases;
    now_    timestamptz;
BEGIN
    PERFORM fencing.check_name('lease key', p_key);
    PERFORM fencing.check_name('owner', p_owner);

    SELECT * INTO row_ FROM fencing.leases l WHERE l.key = p_key FOR UPDATE;
    now_ := clock_timestamp();
    IF NOT FOUND OR row_.owner <> p_owner OR row_.expires_at <= now_ THEN
        RETURN false;
    END IF;
    UPDATE fencing.leases l SET expires_at = now_ WHERE l.key = p_key;
    RETURN true;
END
$$;

-- Binds a resource to a lease key: from then on only that lease's current term, while the
-- lease is held, is admitted for the resource (invariant S4). Returns the resource's maximum.
CREATE OR REPLACE FUNCTION fencing.bind(resource text, lease_key text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    p_resource  ALIAS FOR resource;
    p_lease_key ALIAS FOR lease_key;
    max_        bigint;
BEGIN
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_name('lease key', p_lease_key);

    INSERT INTO fencing.fences AS f (resource, max_term, lease_key, updated_at)
    VALUES (p_resource, 0, p_lease_key, clock_timestamp())
    ON CONFLICT ON CONSTRAINT fences_pkey DO UPDATE
       SET lease_key = excluded.lease_key, updated_at = excluded.updated_at
     WHERE f.lease_key IS DISTINCT FROM excluded.lease_key
    RETURNING f.max_term INTO max_;
    IF NOT FOUND THEN
        SELECT f.max_term INTO max_ FROM fencing.fences f WHERE f.resource = p_resource;
    END IF;
    RETURN max_;
END
$$;

-- The fence decision, without raising: every admission path (admit, guard, the gateway)
-- goes through this one function.
--
-- Admitted when term >= the resource's maximum and, for a bound resource, term is the bound
-- lease's term and that lease is held (unexpired by this database's clock).
-- A higher term raises the maximum and holds the fence row exclusively until the transaction
-- ends. An equal term holds the row in share mode until the transaction ends when hold_lock is
-- true, so no higher term can be admitted until this transaction commits or aborts; a caller
-- whose transaction is this one statement may pass false and take no lock (no write, no WAL).
-- A refusal writes nothing.
CREATE OR REPLACE FUNCTION fencing.try_admit(resource text, term bigint, hold_lock boolean DEFAULT true)
RETURNS fencing.admission
LANGUAGE plpgsql AS $$
DECLARE
    p_resource ALIAS FOR resource;
    p_term     ALIAS FOR term;
    fence_     fencing.fences;
    lease_     fencing.leases;
    max_       bigint;
    attempts   integer := 0;
BEGIN
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_term(p_term);

    LOOP
        attempts := attempts + 1;
        IF attempts > 3 THEN
            RAISE EXCEPTION 'fencing: could not read the fence row of "%"', p_resource
                USING ERRCODE = '40001';
        END IF;
        -- A plain read first: a refusal needs no lock, because the maximum never decreases.
        SELECT * INTO fence_ FROM fencing.fences f WHERE f.resource = p_resource;
        IF NOT FOUND THEN
            -- First write ever to an unbound resource.
            INSERT INTO fencing.fences AS f (resource, max_term, lease_key, updated_at)
            VALUES (p_resource, p_term, NULL, clock_timestamp())
            ON CONFLICT ON CONSTRAINT fences_pkey DO NOTHING;
            IF FOUND THEN
                RETURN (true, 'admitted', p_term, NULL, NULL)::fencing.admission;
            END IF;
            CONTINUE; -- a concurrent writer created it: decide against its row
        END IF;

        IF p_term < fence_.max_term THEN
            RETURN (false, 'stale', fence_.max_term, fence_.lease_key, NULL)::fencing.admission;
        END IF;

        IF fence_.lease_key IS NOT NULL THEN
            SELECT * INTO lease_ FROM fencing.leases l WHERE l.key = fence_.lease_key;
            IF NOT FOUND OR p_term > lease_.term THEN
                RETURN (false, 'future_term', fence_.max_term, fence_.lease_key, lease_.term)::fencing.admission;
            END IF;
            IF p_term < lease_.term THEN
                RETURN (false, 'stale', fence_.max_term, fence_.lease_key, lease_.term)::fencing.admission;
            END IF;
            IF lease_.expires_at <= clock_timestamp() THEN
                RETURN (false, 'not_leader', fence_.max_term, fence_.lease_key, lease_.term)::fencing.admission;
            END IF;
        END IF;

        IF p_term = fence_.max_term THEN
            IF NOT hold_lock THEN
                RETURN (true, 'admitted', p_term, fence_.lease_key, lease_.term)::fencing.admission;
            END IF;
            -- Re-read under a share lock: a concurrent raise is waited for, then seen.
            SELECT f.max_term INTO max_ FROM fencing.fences f
             WHERE f.resource = p_resource FOR SHARE;
            IF max_ = p_term THEN
                RETURN (true, 'admitted', p_term, fence_.lease_key, lease_.term)::fencing.admission;
            END IF;
            RETURN (false, 'stale', max_, fence_.lease_key, lease_.term)::fencing.admission;
        END IF;

        -- A higher term: raise the maximum. The WHERE clause is re-checked against the newest
        -- row version after any concurrent writer commits, so two raises can never both win
        -- with the lower one last.
        UPDATE fencing.fences f
           SET max_term = p_term, updated_at = clock_timestamp()
         WHERE f.resource = p_resource AND f.max_term <= p_term
        RETURNING f.max_term INTO max_;
        IF FOUND THEN
            RETURN (true, 'admitted', p_term, fence_.lease_key, lease_.term)::fencing.admission;
        END IF;
        SELECT f.max_term INTO max_ FROM fencing.fences f WHERE f.resource = p_resource;
        RETURN (false, 'stale', max_, fence_.lease_key, lease_.term)::fencing.admission;
    END LOOP;
END
$$;

-- Raises SQLSTATE ZF409 for a refused admission, naming resource, presented and current term.
CREATE OR REPLACE FUNCTION fencing.raise_refused(resource text, presented_term bigint, decision fencing.admission)
RETURNS void
LANGUAGE plpgsql AS $$
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

-- Admits a write of term to resource, or raises SQLSTATE ZF409.
-- Returns the resource's maximum after the call. Inside a transaction, the fence row stays
-- locked until the transaction ends, so no higher term can slip in before this one commits.
CREATE OR REPLACE FUNCTION fencing.admit(resource text, term bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
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

-- The term a guarded write presents: the transaction setting fencing.token when set,
-- otherwise the row's term column (for UPDATE only when the update changes it).
-- Returns NULL when the write presents no term.
CREATE OR REPLACE FUNCTION fencing.presented_term(op text, new_row jsonb, old_row jsonb, term_column text)
RETURNS bigint
LANGUAGE plpgsql AS $$
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

-- The trigger function fencing.protect attaches: refuses stale writes inside Postgres.
-- Arguments: resource, then optionally the name of the term column.
CREATE OR REPLACE FUNCTION fencing.guard()
RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    resource_    text := TG_ARGV[0];
    term_column_ text := CASE WHEN TG_NARGS > 1 THEN TG_ARGV[1] END;
    new_json     jsonb;
    old_json     jsonb;
    term_        bigint;
BEGIN
    IF TG_LEVEL = 'ROW' AND TG_OP IN ('INSERT', 'UPDATE') THEN
        new_json := to_jsonb(NEW);
    END IF;
    IF TG_LEVEL = 'ROW' AND TG_OP IN ('UPDATE', 'DELETE') THEN
        old_json := to_jsonb(OLD);
    END IF;
    term_ := fencing.presented_term(TG_OP, new_json, old_json,
                                    CASE WHEN TG_LEVEL = 'ROW' THEN term_column_ END);
    IF term_ IS NULL THEN
        RAISE EXCEPTION 'fencing: % on %.% presents no term for resource "%"',
            TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME, resource_
            USING ERRCODE = 'ZF409',
                  DETAIL = format('outcome=missing_token resource=%s presented_term=null current_term=%s',
                                  resource_,
                                  coalesce((SELECT f.max_term::text FROM fencing.fences f WHERE f.resource = resource_), 'null')),
                  HINT = 'SET LOCAL fencing.token to the writer''s term'
                         || CASE WHEN term_column_ IS NOT NULL
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

INSERT INTO fencing.schema_migrations (version, name) VALUES (1, 'init')
ON CONFLICT (version) DO NOTHING;
