-- At REPEATABLE READ or SERIALIZABLE: fails with SQLSTATE 40001 (serialization_failure) when
-- the row of fencing.leases (key) or fencing.fences (resource) changed after the transaction's
-- snapshot was taken, so a decision is never made on an old version of it. The lock that
-- detects it is taken in a subtransaction and released at once: renewals and gateway decisions
-- never queue behind the caller's transaction.
CREATE OR REPLACE FUNCTION fencing.probe_newest(tbl text, id text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    BEGIN
        IF tbl = 'leases' THEN
            PERFORM 1 FROM fencing.leases l WHERE l.key = id FOR SHARE;
        ELSE
            PERFORM 1 FROM fencing.fences f WHERE f.resource = id FOR SHARE;
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'ZF000'; -- roll the subtransaction back: release the lock
    EXCEPTION WHEN SQLSTATE 'ZF000' THEN
        NULL;
    END;
END
$$;

-- Why lease lease_key refuses presented now, or a NULL reason when presented is its current
-- term and it is held; lease_term is the lease's term (NULL when the row is gone). What every
-- decision of a bound fence checks again after it waited (for a row lock, for grants), so that
-- no term is admitted after a newer one was granted, whatever the decision read before it waited
-- (S4; the protocol model found a raise that did not). A plain read: at READ COMMITTED it sees
-- the newest version; at REPEATABLE READ and SERIALIZABLE pass check_snapshot, and a lease
-- changed since the snapshot fails with 40001 first (fencing.probe_newest).
CREATE OR REPLACE FUNCTION fencing.lease_refusal(lease_key text, presented bigint, check_snapshot boolean DEFAULT false,
                                                 OUT reason text, OUT lease_term bigint)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    lease_end_ timestamptz;
BEGIN
    IF check_snapshot THEN
        PERFORM fencing.probe_newest('leases', lease_key);
    END IF;
    SELECT l.term, l.expires_at INTO lease_term, lease_end_ FROM fencing.leases l WHERE l.key = lease_key;
    IF NOT FOUND OR presented > lease_term THEN
        reason := 'future_term';
    ELSIF presented < lease_term THEN
        reason := 'stale';
    ELSIF lease_end_ <= clock_timestamp() THEN
        reason := 'not_leader';
    END IF;
END
$$;
