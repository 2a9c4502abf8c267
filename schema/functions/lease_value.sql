-- A leader's value (schema version 11): a small JSON value the holder attaches to its lease for
-- others to find it (its address, its version). Only the holder may set it, naming its term,
-- while it holds the lease by the store's clock: a zombie's call with its old term, or after its
-- lease expired, changes nothing and answers false. JSON null clears it. At most 4096 bytes of
-- JSON text (SQLSTATE 22023 beyond, nothing changed).
CREATE OR REPLACE FUNCTION fencing.set_lease_value(key text, owner text, term bigint, value jsonb)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_key   ALIAS FOR key;
    p_owner ALIAS FOR owner;
    p_term  ALIAS FOR term;
    p_value ALIAS FOR value;
BEGIN
    PERFORM fencing.check_name('lease key', p_key);
    PERFORM fencing.check_name('owner', p_owner);
    PERFORM fencing.check_term(p_term);
    IF octet_length(p_value::text) > 4096 THEN
        RAISE EXCEPTION 'fencing: a lease value is at most 4096 bytes of JSON, got %', octet_length(p_value::text)
            USING ERRCODE = '22023';
    END IF;
    UPDATE fencing.leases l
       SET value = CASE WHEN p_value IS NULL OR jsonb_typeof(p_value) = 'null' THEN NULL ELSE p_value END,
           value_term = p_term
     WHERE l.key = p_key AND l.owner = p_owner AND l.term = p_term AND l.expires_at > clock_timestamp();
    RETURN FOUND;
END
$$;

-- The value of the lease's current (or last) term, NULL when its holder set none.
CREATE OR REPLACE FUNCTION fencing.lease_value(lease_ fencing.leases) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$ SELECT CASE WHEN lease_.value_term = lease_.term THEN lease_.value END $$;

-- One lease as a reader sees it (observe): its last holder, term and times, the time it has left
-- by the store's clock (0 once it ended), the value of its term as JSON text, and what is left of
-- its lock-delay (schema version 12). No row for a
-- key never acquired. Runs with its owner's rights, so a role granted EXECUTE on it needs no
-- privilege on the table.
CREATE OR REPLACE FUNCTION fencing.read_lease(lease_key text)
RETURNS TABLE (key text, owner text, term bigint, acquired_at timestamptz, renewed_at timestamptz,
               expires_at timestamptz, remaining_ms bigint, value text, lock_delay_ms bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM fencing.check_name('lease key', lease_key);
    RETURN QUERY
        SELECT l.key, l.owner, l.term, l.acquired_at, l.renewed_at, l.expires_at,
               fencing.remaining_ms(l.expires_at, clock_timestamp()), fencing.lease_value(l)::text,
               fencing.lock_delay_left(l, clock_timestamp())
          FROM fencing.leases l WHERE l.key = lease_key;
END
$$;
