-- Applied last, after every function file: who may call what, and the event trigger that
-- protects new partitions and children of protected tables.

-- Deny by default: no role may call a fencing function unless granted. The gateway and the
-- DBA's own role own the schema (or are granted what they call); a guarded writer needs
-- nothing, because the guard runs with its owner's rights. Grant applications what they call:
--   GRANT USAGE ON SCHEMA fencing TO app;
--   GRANT EXECUTE ON FUNCTION fencing.acquire(text, text, interval, boolean), fencing.renew(text, text, interval),
--       fencing.release(text, text), fencing.admit(text, bigint),
--       fencing.set_lease_value(text, text, bigint, jsonb), fencing.read_lease(text),
--       fencing.observe_lease(text) TO app;
--   and for a fenced log (schema version 16), to its leader and its followers:
--   GRANT EXECUTE ON FUNCTION fencing.append(text, bigint, jsonb), fencing.append(text, bigint, jsonb[]),
--       fencing.read_stream(text, bigint, integer), fencing.report_position(text, text, bigint) TO app;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fencing FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA fencing REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA fencing FROM PUBLIC;
-- Run with the caller's rights by whoever adds a partition or child to a protected table.
GRANT EXECUTE ON FUNCTION fencing.protect_tree(regclass, text, text), fencing.protect_one(regclass, text, text)
    TO PUBLIC;

-- New partitions and inheritance children of protected tables are protected as they appear.
-- Creating an event trigger needs a superuser: without one, run fencing.protect again after
-- adding a partition or child (the README says so).
DO $$
BEGIN
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        IF EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'fencing_protect_children') THEN
            DROP EVENT TRIGGER fencing_protect_children;
        END IF;
        CREATE EVENT TRIGGER fencing_protect_children ON ddl_command_end
            WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE')
            EXECUTE FUNCTION fencing.protect_children();
    END IF;
END
$$;
