-- fencing-gateway schema, version 16: the fenced log (replication model B).
--
-- A stream is an append-only log bound to a lease: an append carries a term and is admitted
-- only while that term is the lease's current term (S3 and S4, through the stream's fence
-- 'fencing.log/<stream>', which fencing.create_stream makes and binds). Every admitted entry gets
-- the stream's next sequence number, given under the stream row's lock, which is held until the
-- append commits: entry n + 1 can commit only after entry n did, so a reader never sees n + 1
-- without n and never skips one (a plain sequence gives numbers in the order of nextval, not of
-- commit). Entries are immutable: a trigger refuses UPDATE, TRUNCATE, and any INSERT or DELETE
-- but fencing.append's and retention's. Followers report the sequence they applied; retention
-- (fencing.retain_stream) removes entries by count or age, never past the slowest follower
-- unless the stream's max_entries says so. The functions are in schema/functions/log.sql.
--
-- Apply with psql in one transaction together with every file of schema/functions/ in name order
-- (see the README).

CREATE TABLE IF NOT EXISTS fencing.streams (
    stream      text PRIMARY KEY,
    -- The last sequence number given (0: no entry yet).
    head        bigint NOT NULL DEFAULT 0 CHECK (head >= 0),
    -- The oldest entry kept: every entry below it was removed by retention.
    first_seq   bigint NOT NULL DEFAULT 1 CHECK (first_seq >= 1),
    -- Retention: an entry may go once keep_count newer ones exist, or once it is older than
    -- keep_age (either; NULL: no such limit), but not while a follower has not applied it,
    -- unless more than max_entries are kept (NULL: followers always hold entries back).
    keep_count  bigint CHECK (keep_count > 0),
    keep_age    interval CHECK (keep_age > interval '0'),
    max_entries bigint CHECK (max_entries > 0),
    created_at  timestamptz NOT NULL,
    appended_at timestamptz,
    CHECK (first_seq <= head + 1)
);

CREATE TABLE IF NOT EXISTS fencing.stream_entries (
    stream      text NOT NULL,
    seq         bigint NOT NULL,
    term        bigint NOT NULL,
    appended_at timestamptz NOT NULL,
    payload     jsonb NOT NULL,
    PRIMARY KEY (stream, seq)
);

CREATE TABLE IF NOT EXISTS fencing.stream_followers (
    stream      text NOT NULL,
    follower    text NOT NULL,
    -- The last sequence number the follower applied.
    position    bigint NOT NULL CHECK (position >= 0),
    reported_at timestamptz NOT NULL,
    PRIMARY KEY (stream, follower)
);

INSERT INTO fencing.schema_migrations (version, name) VALUES (16, 'log')
ON CONFLICT (version) DO NOTHING;
