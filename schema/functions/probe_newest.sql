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
