-- fencing-gateway schema, version 4: repeatable function files, and the history of leadership
-- periods.
--
-- From this version on, versioned migrations (this folder) change tables and types only. The
-- current text of every function lives in one file of schema/functions/, applied after the
-- versioned migrations whenever it changed (like Flyway's repeatable migrations), so the
-- history of one file is the history of one function.
--
-- Apply with psql in one transaction:
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 --single-transaction -f 0004_functions.sql
-- then every file of schema/functions/ in name order (see the README).

-- The repeatable files applied by `fencing-gateway migrate`, with the md5 of the text applied.
CREATE TABLE IF NOT EXISTS fencing.repeatable_migrations (
    name       text        PRIMARY KEY,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per leadership period, written in the transaction that grants the term and closed
-- when the period ends. Incident reviews and the fault checker read it.
CREATE TABLE IF NOT EXISTS fencing.lease_history (
    key        text        NOT NULL,
    term       bigint      NOT NULL CHECK (term >= 1),
    owner      text        NOT NULL,
    granted_at timestamptz NOT NULL,
    -- NULL while the period may still be running; set when it is known to have ended.
    ended_at   timestamptz NULL,
    -- released, expired, abandoned (the holder started a new period), force_released
    end_reason text        NULL,
    PRIMARY KEY (key, term)
);

COMMENT ON TABLE fencing.lease_history IS
    'One row per leadership period: who held which term of which key, from when to when by the store''s clock.';

-- The periods of leases granted before this version.
INSERT INTO fencing.lease_history (key, term, owner, granted_at, ended_at, end_reason)
SELECT l.key, l.term, l.owner, l.acquired_at,
       CASE WHEN l.expires_at <= clock_timestamp() THEN l.expires_at END,
       CASE WHEN l.expires_at <= clock_timestamp() THEN 'expired' END
  FROM fencing.leases l
ON CONFLICT DO NOTHING;

-- Who sent a refused write: the client's address and the request id, to find a zombie.
ALTER TABLE fencing.refusals ADD COLUMN IF NOT EXISTS client_addr text NULL;
ALTER TABLE fencing.refusals ADD COLUMN IF NOT EXISTS request_id text NULL;

-- Writes refused inside Postgres (fencing.admit, the guard). A refusal rolls its transaction
-- back, and with it any row it wrote; a sequence's nextval survives the rollback, so this
-- counts every one of them (the gateway exports it as fencing_sql_refusals_total).
CREATE SEQUENCE IF NOT EXISTS fencing.sql_refusals;

INSERT INTO fencing.schema_migrations (version, name) VALUES (4, 'functions')
ON CONFLICT (version) DO NOTHING;
