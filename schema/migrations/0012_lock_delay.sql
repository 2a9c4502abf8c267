-- fencing-gateway schema, version 12: lock-delay (as Consul's sessions have it).
--
-- A resource that cannot check a fencing token gets no protection from the fence: after its
-- leader crashed or was cut off, that leader's last writes may still be on their way to it. A
-- lock-delay keeps the next term from starting for a while after a period that ended without
-- a release (it expired, or an operator forced it), measured on the store's clock from the
-- period's end. A period its holder released ends cleanly: no delay.
--   - fencing.lease_settings: per lease key, lock_delay_ms;
--   - fencing.lease_defaults: one row, the lock_delay_ms of keys without a setting (0: none);
--   - fencing.set_lock_delay(key, delay, actor, reason): sets either (key NULL: the default),
--     audited;
--   - lease_result.lock_delay_ms: an acquire refused for the delay says how much of it is left.
--
-- Apply with psql in one transaction together with every file of schema/functions/ in name order
-- (see the README).

CREATE TABLE IF NOT EXISTS fencing.lease_settings (
    key           text PRIMARY KEY,
    lock_delay_ms bigint NOT NULL CHECK (lock_delay_ms >= 0 AND lock_delay_ms <= 3600000)
);

CREATE TABLE IF NOT EXISTS fencing.lease_defaults (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    lock_delay_ms bigint NOT NULL DEFAULT 0 CHECK (lock_delay_ms >= 0 AND lock_delay_ms <= 3600000)
);
INSERT INTO fencing.lease_defaults (singleton, lock_delay_ms) VALUES (true, 0) ON CONFLICT DO NOTHING;

COMMENT ON TABLE fencing.lease_settings IS
    'Per lease key: after a period that ended without a release, no new term until lock_delay_ms has passed on the store''s clock.';
COMMENT ON TABLE fencing.lease_defaults IS
    'The lock_delay_ms of lease keys without a row in fencing.lease_settings.';

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                    WHERE attrelid = 'fencing.lease_result'::regclass AND attname = 'lock_delay_ms' AND NOT attisdropped) THEN
        ALTER TYPE fencing.lease_result ADD ATTRIBUTE lock_delay_ms bigint;
    END IF;
    -- fencing.read_lease gains a column (its lock-delay): version 11's cannot be replaced in
    -- place, so it is dropped here and made again by its function file (version 11 never left
    -- development; a role granted EXECUTE on it there must be granted again).
    IF to_regprocedure('fencing.read_lease(text)') IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pg_proc p
                        WHERE p.oid = to_regprocedure('fencing.read_lease(text)')
                          AND 'lock_delay_ms' = ANY (p.proargnames)) THEN
        DROP FUNCTION fencing.read_lease(text);
    END IF;
END
$$;

INSERT INTO fencing.schema_migrations (version, name) VALUES (12, 'lock_delay')
ON CONFLICT (version) DO NOTHING;
