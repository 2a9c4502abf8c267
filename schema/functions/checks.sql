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

-- Refuses a null, non-positive or overlong forward timeout with SQLSTATE 22023.
CREATE OR REPLACE FUNCTION fencing.check_forward_timeout(forward_timeout interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF forward_timeout IS NULL OR forward_timeout <= interval '0' OR forward_timeout > interval '1 hour' THEN
        RAISE EXCEPTION 'fencing: forward timeout must be positive and at most 01:00:00, got %',
            coalesce(forward_timeout::text, 'null')
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- Makes the calling transaction commit synchronously, whatever the session, the role or the
-- database set: every function that grants a term or changes a fence calls it before it
-- writes, so a decision that was answered survives a crash of Postgres (S2, S3). The setting is
-- transaction-local (set_config(..., true)), so it lasts until the commit, unlike a SET clause
-- on the function, which reverts when the function returns. 'local' is raised to 'on' too;
-- remote_write and remote_apply (synchronous replication) are kept as they are.
CREATE OR REPLACE FUNCTION fencing.commit_durably() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END
$$;

-- Refuses, with SQLSTATE 22023, a name that cannot be bound to a lease or protected: names
-- beginning with '/' are the gateway's unbound routes' own (route prefix, '/', resource), so an
-- unbound route can never create, raise or poison a fence that a lease or a table uses (S8).
CREATE OR REPLACE FUNCTION fencing.check_bindable(resource text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF left(resource, 1) = '/' THEN
        RAISE EXCEPTION 'fencing: resource names beginning with / belong to unbound gateway routes and cannot be bound or protected, got "%"', resource
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- Refuses, with SQLSTATE 22023, a new fence under a name the schema keeps for its own fences:
-- 'fencing.daemons/<cluster>' fences a cluster's daemon assignments, created and bound only by
-- fencing.reconcile_daemons (a fence made first by any other writer could be given a maximum
-- or a lease no daemons leader could ever pass); 'fencing.log/<stream>' fences a fenced log's
-- appends, created and bound only by fencing.create_stream.
CREATE OR REPLACE FUNCTION fencing.check_unreserved(resource text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF left(resource, 16) = 'fencing.daemons/' THEN
        RAISE EXCEPTION 'fencing: resource names beginning with fencing.daemons/ are the daemons'' own, got "%"', resource
            USING ERRCODE = '22023';
    END IF;
    IF left(resource, 12) = 'fencing.log/' THEN
        RAISE EXCEPTION 'fencing: resource names beginning with fencing.log/ are the fenced logs'' own (fencing.create_stream), got "%"', resource
            USING ERRCODE = '22023';
    END IF;
END
$$;
