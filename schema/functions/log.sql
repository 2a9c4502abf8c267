-- The fenced log (schema version 16): streams bound to a lease, appended to only by the lease's
-- current term, read in order without gaps, followed by followers that report their position,
-- and trimmed by retention. The tables and the reasons are in schema/migrations/0016_log.sql.

-- The fence of a stream's appends.
CREATE OR REPLACE FUNCTION fencing.log_resource(stream text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'fencing.log/' || stream $$;

-- Refuses a stream name that is null, empty or longer than 244 characters (its fence's name,
-- 'fencing.log/' and the stream's, is then at most 256, as every resource name), SQLSTATE 22023.
CREATE OR REPLACE FUNCTION fencing.check_stream(stream text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM fencing.check_name('stream', stream);
    IF length(stream) > 244 THEN
        RAISE EXCEPTION 'fencing: stream must be at most 244 characters, got %', length(stream)
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- Refuses a retention setting that is not positive (NULL: no such limit), SQLSTATE 22023.
CREATE OR REPLACE FUNCTION fencing.check_retention(keep_count bigint, keep_age interval, max_entries bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF keep_count < 1 OR keep_age <= interval '0' OR keep_age > interval '100 years' OR max_entries < 1 THEN
        RAISE EXCEPTION 'fencing: keep_count, keep_age (at most 100 years) and max_entries must be positive or null, got %, %, %',
            keep_count, keep_age, max_entries
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- Refuses (ZF409, outcome wrong_lease) a writer naming lease_key on a stream bound to another
-- lease; a NULL lease_key names none.
CREATE OR REPLACE FUNCTION fencing.check_stream_lease(stream text, term bigint, lease_key text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    resource_ text := fencing.log_resource(stream);
BEGIN
    IF lease_key IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM fencing.fences f WHERE f.resource = resource_ AND f.lease_key = check_stream_lease.lease_key) THEN
        PERFORM nextval('fencing.sql_refusals');
        RAISE EXCEPTION 'fencing: write to resource "%" refused (wrong lease): stream "%" is not bound to lease "%"',
            resource_, stream, lease_key
            USING ERRCODE = 'ZF409',
                  DETAIL = format('outcome=wrong_lease resource=%s presented_term=%s current_term=null', resource_, term);
    END IF;
END
$$;

-- The stream row, or SQLSTATE 42704 when there is none.
CREATE OR REPLACE FUNCTION fencing.stream_row(stream text) RETURNS fencing.streams
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_stream ALIAS FOR stream;
    stream_  fencing.streams;
BEGIN
    SELECT * INTO stream_ FROM fencing.streams s WHERE s.stream = p_stream;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fencing: no stream "%"; create it with fencing.create_stream(stream, lease_key)', p_stream
            USING ERRCODE = '42704';
    END IF;
    RETURN stream_;
END
$$;

-- Creates a stream bound to lease_key, with its retention (see fencing.retain_stream). True when
-- it was created; false when it exists already bound to lease_key (nothing changed: retention
-- changes with fencing.set_retention). A stream bound to another lease is refused (SQLSTATE
-- 22023): moving it is the audited fencing.rebind(fencing.log_resource(stream), ...).
CREATE OR REPLACE FUNCTION fencing.create_stream(stream text, lease_key text, keep_count bigint DEFAULT NULL,
                                                 keep_age interval DEFAULT NULL, max_entries bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_stream    ALIAS FOR stream;
    p_lease_key ALIAS FOR lease_key;
    resource_   text := fencing.log_resource(stream);
    bound_      text;
    created_    boolean;
BEGIN
    PERFORM fencing.check_stream(p_stream);
    PERFORM fencing.check_name('lease key', p_lease_key);
    PERFORM fencing.check_retention(keep_count, keep_age, max_entries);
    PERFORM fencing.commit_durably();
    INSERT INTO fencing.fences (resource, max_term, lease_key, updated_at)
    VALUES (resource_, 0, p_lease_key, clock_timestamp())
    ON CONFLICT ON CONSTRAINT fences_pkey DO NOTHING;
    SELECT f.lease_key INTO bound_ FROM fencing.fences f WHERE f.resource = resource_;
    IF bound_ IS DISTINCT FROM p_lease_key THEN
        RAISE EXCEPTION 'fencing: stream "%" is bound to lease "%"; moving it to "%" is an audited admin action: fencing.rebind(%L, lease_key, actor, reason)',
            p_stream, bound_, p_lease_key, resource_
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO fencing.streams AS s (stream, keep_count, keep_age, max_entries, created_at)
    VALUES (p_stream, keep_count, keep_age, max_entries, clock_timestamp())
    ON CONFLICT ON CONSTRAINT streams_pkey DO NOTHING;
    GET DIAGNOSTICS created_ = ROW_COUNT;
    RETURN created_;
END
$$;

-- Changes a stream's retention; the next fencing.retain_stream applies it.
CREATE OR REPLACE FUNCTION fencing.set_retention(stream text, keep_count bigint, keep_age interval, max_entries bigint)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_stream ALIAS FOR stream;
BEGIN
    PERFORM fencing.check_stream(p_stream);
    PERFORM fencing.check_retention(keep_count, keep_age, max_entries);
    PERFORM fencing.stream_row(p_stream);
    UPDATE fencing.streams s SET keep_count = set_retention.keep_count, keep_age = set_retention.keep_age,
                                 max_entries = set_retention.max_entries
     WHERE s.stream = p_stream;
END
$$;

-- Appends payloads (1 to 1000 JSON values, at most 1 MiB of JSON text in all) to stream as the
-- writer of term (of lease_key, when given: refused with ZF409, outcome wrong_lease, on a stream
-- bound to another lease), and returns the sequence number of the first (the others follow it without a
-- gap). Refused with SQLSTATE ZF409 (nothing appended) unless term is the stream's lease's
-- current term while that lease is held: fencing.admit on the stream's fence, whose row stays
-- locked until the transaction ends, so a new term's first append waits for the old term's
-- open appends, and every later append of the old term is refused. The numbers are given under
-- the stream row's lock, also held until the transaction ends: appends to one stream commit in
-- the order of their numbers, so a reader never skips one. Commits durably, whatever the
-- session's synchronous_commit. Wakes followers (channel fencing_watch, 'log:<stream>').
CREATE OR REPLACE FUNCTION fencing.append(stream text, term bigint, payloads jsonb[], lease_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_stream ALIAS FOR stream;
    p_term   ALIAS FOR term;
    p_lease  ALIAS FOR lease_key;
    count_   integer := coalesce(cardinality(payloads), 0);
    head_    bigint;
    now_     timestamptz;
BEGIN
    PERFORM fencing.check_stream(p_stream);
    PERFORM fencing.check_term(p_term);
    IF count_ < 1 OR count_ > 1000 THEN
        RAISE EXCEPTION 'fencing: an append carries 1 to 1000 entries, got %', count_
            USING ERRCODE = '22023';
    END IF;
    IF array_ndims(payloads) <> 1 THEN
        RAISE EXCEPTION 'fencing: the entries of an append are a one-dimensional array'
            USING ERRCODE = '22023';
    END IF;
    IF array_position(payloads, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'fencing: an entry must not be null (JSON null is ''null''::jsonb)'
            USING ERRCODE = '22023';
    END IF;
    IF (SELECT sum(octet_length(p::text)) FROM unnest(payloads) AS p) > 1048576 THEN
        RAISE EXCEPTION 'fencing: an append carries at most 1 MiB of JSON text'
            USING ERRCODE = '22023';
    END IF;
    PERFORM fencing.stream_row(p_stream);
    PERFORM fencing.commit_durably();
    -- S3 and S4 for the stream: ZF409 unless term is its lease's current term, lease held.
    PERFORM fencing.admit(fencing.log_resource(p_stream), p_term);
    -- A writer that names its lease is refused on a stream bound to another (the terms of two
    -- leases are unrelated numbers that may well be equal): the fence row is locked now.
    PERFORM fencing.check_stream_lease(p_stream, p_term, p_lease);
    UPDATE fencing.streams s SET head = s.head + count_, appended_at = clock_timestamp()
     WHERE s.stream = p_stream
    RETURNING s.head, s.appended_at INTO head_, now_;
    PERFORM set_config('fencing.log_writer', 'append', true);
    INSERT INTO fencing.stream_entries (stream, seq, term, appended_at, payload)
    SELECT p_stream, head_ - count_ + u.n, p_term, now_, u.payload
      FROM unnest(payloads) WITH ORDINALITY AS u(payload, n);
    PERFORM set_config('fencing.log_writer', '', true);
    PERFORM pg_notify('fencing_watch', 'log:' || p_stream);
    RETURN head_ - count_ + 1;
END
$$;

-- A new leader's barrier before it reads the log: admits term on the stream's fence (waiting for
-- the old term's open appends, which may still commit, and refusing every later one; ZF409 unless
-- term is the lease's current term while held, and, with lease_key, the stream's lease) and
-- returns the head once they are done. Call it in a transaction of its own, then read up to it.
CREATE OR REPLACE FUNCTION fencing.open_stream(stream text, term bigint, lease_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_stream ALIAS FOR stream;
    p_term   ALIAS FOR term;
    p_lease  ALIAS FOR lease_key;
BEGIN
    PERFORM fencing.check_stream(p_stream);
    PERFORM fencing.check_term(p_term);
    PERFORM fencing.stream_row(p_stream);
    PERFORM fencing.commit_durably();
    PERFORM fencing.admit(fencing.log_resource(p_stream), p_term);
    PERFORM fencing.check_stream_lease(p_stream, p_term, p_lease);
    -- Read after the fence: every append of an older term has ended by now.
    RETURN (SELECT s.head FROM fencing.streams s WHERE s.stream = p_stream);
END
$$;

-- One entry: its sequence number.
CREATE OR REPLACE FUNCTION fencing.append(stream text, term bigint, payload jsonb)
RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT fencing.append(stream, term, ARRAY[payload])
$$;

-- Up to max_count entries of stream after sequence number after, in order, without a gap, and
-- no more than max_bytes of payload text past the first (the first always comes, so a reader
-- always moves on). A
-- reader that asks for entries retention removed gets SQLSTATE ZF410, "compacted", with the
-- sequence to resnapshot from (DETAIL first_seq=<n>: take a snapshot of the state up to n - 1,
-- then read after n - 1); one that asks after the stream's head (its position is from a log
-- this database lost, as in a failover without synchronous replication) gets SQLSTATE 22023.
CREATE OR REPLACE FUNCTION fencing.read_stream(stream text, after bigint, max_count integer DEFAULT 100,
                                               max_bytes integer DEFAULT 4194304)
RETURNS TABLE (seq bigint, term bigint, appended_at timestamptz, payload jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_stream ALIAS FOR stream;
    stream_  fencing.streams;
BEGIN
    PERFORM fencing.check_stream(p_stream);
    IF after IS NULL OR after < 0 THEN
        RAISE EXCEPTION 'fencing: after must be a sequence number >= 0, got %', coalesce(after::text, 'null')
            USING ERRCODE = '22023';
    END IF;
    IF max_bytes IS NULL OR max_bytes < 1 THEN
        RAISE EXCEPTION 'fencing: max_bytes must be positive, got %', coalesce(max_bytes::text, 'null')
            USING ERRCODE = '22023';
    END IF;
    IF max_count IS NULL OR max_count < 1 OR max_count > 10000 THEN
        RAISE EXCEPTION 'fencing: max_count must be 1 to 10000, got %', coalesce(max_count::text, 'null')
            USING ERRCODE = '22023';
    END IF;
    stream_ := fencing.stream_row(p_stream);
    IF after < stream_.first_seq - 1 THEN
        RAISE EXCEPTION 'fencing: stream "%" is compacted: entries % to % are gone; resnapshot from sequence %',
            p_stream, after + 1, stream_.first_seq - 1, stream_.first_seq
            USING ERRCODE = 'ZF410',
                  DETAIL = format('first_seq=%s', stream_.first_seq),
                  HINT = format('take a snapshot of the state up to sequence %s, then read after it', stream_.first_seq - 1);
    END IF;
    IF after > stream_.head THEN
        RAISE EXCEPTION 'fencing: stream "%" ends at sequence %, not after %: this position is from a log the database no longer has',
            p_stream, stream_.head, after
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
        SELECT q.seq, q.term, q.appended_at, q.payload
          FROM (SELECT e.seq, e.term, e.appended_at, e.payload,
                       sum(octet_length(e.payload::text)) OVER (ORDER BY e.seq) AS bytes_through,
                       row_number() OVER (ORDER BY e.seq) AS n
                  FROM fencing.stream_entries e
                 WHERE e.stream = p_stream AND e.seq > after
                 ORDER BY e.seq
                 LIMIT max_count) q
         WHERE q.n = 1 OR q.bytes_through <= max_bytes
         ORDER BY q.seq;
END
$$;

-- A follower's report: the last sequence number it applied (from the stream's first kept entry
-- minus one up to its head; one retention passed is ZF410 "compacted", as at a read). Registers the follower: retention keeps every entry it has not
-- applied (unless the stream's max_entries says otherwise) until fencing.forget_follower.
-- Returns the stream's head and how long ago the first entry the follower has not applied was
-- appended, by the store's clock (0 when it applied all): its lag in entries and in time.
CREATE OR REPLACE FUNCTION fencing.report_position(stream text, follower text, applied bigint)
RETURNS TABLE (head bigint, lag_ms bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_stream   ALIAS FOR stream;
    p_follower ALIAS FOR follower;
    stream_    fencing.streams;
BEGIN
    PERFORM fencing.check_stream(p_stream);
    PERFORM fencing.check_name('follower', p_follower);
    PERFORM fencing.stream_row(p_stream);
    -- Checked on the row as retention leaves it: a retention running now waits for this report
    -- (its FOR UPDATE conflicts with FOR KEY SHARE; an append's update does not), or this waits
    -- for it and checks against the entries it left.
    SELECT * INTO stream_ FROM fencing.streams s WHERE s.stream = p_stream FOR KEY SHARE;
    IF applied IS NULL OR applied < 0 OR applied > stream_.head THEN
        RAISE EXCEPTION 'fencing: follower "%" of stream "%" reports sequence %, outside 0 to %',
            p_follower, p_stream, coalesce(applied::text, 'null'), stream_.head
            USING ERRCODE = '22023';
    END IF;
    -- A position retention already passed (a batch read before a pause, reported after it):
    -- the follower is told to resnapshot, as its next read would tell it.
    IF applied < stream_.first_seq - 1 THEN
        RAISE EXCEPTION 'fencing: stream "%" is compacted: entries % to % are gone; resnapshot from sequence %',
            p_stream, applied + 1, stream_.first_seq - 1, stream_.first_seq
            USING ERRCODE = 'ZF410',
                  DETAIL = format('first_seq=%s', stream_.first_seq),
                  HINT = format('take a snapshot of the state up to sequence %s, then report it', stream_.first_seq - 1);
    END IF;
    INSERT INTO fencing.stream_followers AS f (stream, follower, position, reported_at)
    VALUES (p_stream, p_follower, applied, clock_timestamp())
    ON CONFLICT ON CONSTRAINT stream_followers_pkey
    DO UPDATE SET position = EXCLUDED.position, reported_at = EXCLUDED.reported_at;
    RETURN QUERY
        SELECT stream_.head,
               coalesce((SELECT greatest(0, floor(extract(epoch FROM clock_timestamp() - e.appended_at) * 1000))::bigint
                           FROM fencing.stream_entries e WHERE e.stream = p_stream AND e.seq = applied + 1), 0);
END
$$;

-- Unregisters a follower: retention no longer waits for it. True when it was registered.
CREATE OR REPLACE FUNCTION fencing.forget_follower(stream text, follower text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM fencing.check_stream(forget_follower.stream);
    PERFORM fencing.check_name('follower', forget_follower.follower);
    PERFORM fencing.stream_row(forget_follower.stream);
    DELETE FROM fencing.stream_followers f WHERE f.stream = forget_follower.stream AND f.follower = forget_follower.follower;
    RETURN FOUND;
END
$$;

-- A stream's followers: the sequence each applied, how far behind the head it is in entries and
-- in time (since the first entry it has not applied was appended, 0 when it has applied all;
-- null when that is unknown: the entry after its position was removed by retention, or its
-- position is past the head, as after a failover that lost entries), and when it last reported,
-- by the store's clock.
CREATE OR REPLACE FUNCTION fencing.followers_of(stream text)
RETURNS TABLE (follower text, applied bigint, lag_entries bigint, lag_ms bigint, reported_at timestamptz,
               reported_ms_ago bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_stream ALIAS FOR stream;
    stream_  fencing.streams;
    now_     timestamptz := clock_timestamp();
BEGIN
    PERFORM fencing.check_stream(p_stream);
    stream_ := fencing.stream_row(p_stream);
    RETURN QUERY
        SELECT f.follower, f.position, stream_.head - f.position,
               CASE WHEN f.position = stream_.head THEN 0::bigint
                    WHEN e.seq IS NULL THEN NULL::bigint
                    ELSE greatest(0, floor(extract(epoch FROM now_ - e.appended_at) * 1000))::bigint END,
               f.reported_at, greatest(0, floor(extract(epoch FROM now_ - f.reported_at) * 1000))::bigint
          FROM fencing.stream_followers f
          LEFT JOIN fencing.stream_entries e ON e.stream = f.stream AND e.seq = f.position + 1
         WHERE f.stream = p_stream
         ORDER BY f.follower;
END
$$;

-- Removes the entries stream's retention lets go, and returns how many. An entry may go once
-- keep_count newer entries exist or once it is older than keep_age (either limit; neither set:
-- none goes), but never while a registered follower has not applied it, unless the stream keeps
-- more than max_entries: then the oldest go down to max_entries, whoever has not applied them
-- (such a follower is told "compacted" at its next read). Holds the stream row while it runs.
CREATE OR REPLACE FUNCTION fencing.retain_stream(stream text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_stream ALIAS FOR stream;
    stream_  fencing.streams;
    cut_     bigint;
    aged_    bigint;
    slowest_ bigint;
    removed_ bigint;
BEGIN
    PERFORM fencing.check_stream(p_stream);
    -- The followers are read after the stream row's lock, on the newest rows: a snapshot older
    -- than a follower's report would remove what it has not applied.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'fencing: retention runs at READ COMMITTED only, not at % (a snapshot may predate a follower''s report)',
            current_setting('transaction_isolation')
            USING ERRCODE = '0A000';
    END IF;
    PERFORM fencing.stream_row(p_stream);
    SELECT * INTO stream_ FROM fencing.streams s WHERE s.stream = p_stream FOR UPDATE;
    cut_ := stream_.first_seq - 1;
    IF stream_.keep_count IS NOT NULL THEN
        cut_ := greatest(cut_, stream_.head - stream_.keep_count);
    END IF;
    IF stream_.keep_age IS NOT NULL THEN
        SELECT max(e.seq) INTO aged_ FROM fencing.stream_entries e
         WHERE e.stream = p_stream AND e.appended_at < clock_timestamp() - stream_.keep_age;
        cut_ := greatest(cut_, coalesce(aged_, cut_));
    END IF;
    SELECT min(f.position) INTO slowest_ FROM fencing.stream_followers f WHERE f.stream = p_stream;
    cut_ := least(cut_, coalesce(slowest_, cut_));
    IF stream_.max_entries IS NOT NULL THEN
        cut_ := greatest(cut_, stream_.head - stream_.max_entries);
    END IF;
    IF cut_ < stream_.first_seq THEN
        RETURN 0;
    END IF;
    -- first_seq first: the guard lets retention remove only entries below it.
    UPDATE fencing.streams s SET first_seq = cut_ + 1 WHERE s.stream = p_stream;
    PERFORM set_config('fencing.log_writer', 'retain', true);
    DELETE FROM fencing.stream_entries e WHERE e.stream = p_stream AND e.seq <= cut_;
    GET DIAGNOSTICS removed_ = ROW_COUNT;
    PERFORM set_config('fencing.log_writer', '', true);
    RETURN removed_;
END
$$;

-- A stream as an operator sees it: its lease, its head and first kept entry, when it was last
-- appended to, its retention and its followers' count.
CREATE OR REPLACE FUNCTION fencing.stream_status(stream text)
RETURNS TABLE (lease_key text, max_term bigint, head bigint, first_seq bigint,
               appended_at timestamptz, keep_count bigint, keep_age interval, max_entries bigint,
               followers bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_stream ALIAS FOR stream;
BEGIN
    PERFORM fencing.check_stream(p_stream);
    PERFORM fencing.stream_row(p_stream);
    RETURN QUERY
        SELECT f.lease_key, f.max_term, s.head, s.first_seq, s.appended_at, s.keep_count, s.keep_age,
               s.max_entries, (SELECT count(*) FROM fencing.stream_followers x WHERE x.stream = s.stream)
          FROM fencing.streams s
          LEFT JOIN fencing.fences f ON f.resource = fencing.log_resource(s.stream)
         WHERE s.stream = p_stream;
END
$$;

-- The entries' guard: entries are written by fencing.append and removed by retention only.
-- This refuses mistakes of the roles that hold the table's privileges (no application is
-- granted them): the schema's owner can still drop the trigger, or write entries where append
-- and retention would (a number at or below the head that no committed entry holds, an entry
-- already below the first kept one).
CREATE OR REPLACE FUNCTION fencing.entries_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    writer_ text := coalesce(current_setting('fencing.log_writer', true), '');
BEGIN
    -- Even with the setting, only where append and retention write: an entry numbered by its
    -- stream's head, a removal below its first kept entry.
    IF TG_OP = 'INSERT' AND writer_ = 'append'
       AND EXISTS (SELECT 1 FROM fencing.streams s
                    WHERE s.stream = NEW.stream AND NEW.seq BETWEEN s.first_seq AND s.head) THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'DELETE' AND writer_ = 'retain'
       AND EXISTS (SELECT 1 FROM fencing.streams s WHERE s.stream = OLD.stream AND OLD.seq < s.first_seq) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'fencing: the entries of a fenced log are immutable: % is refused (entries are added by fencing.append and removed by fencing.retain_stream only)',
        TG_OP
        USING ERRCODE = '42501';
END
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger t
                    WHERE t.tgrelid = 'fencing.stream_entries'::regclass AND t.tgname = 'fencing_entries_guard') THEN
        CREATE TRIGGER fencing_entries_guard BEFORE INSERT OR UPDATE OR DELETE ON fencing.stream_entries
            FOR EACH ROW EXECUTE FUNCTION fencing.entries_guard();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger t
                    WHERE t.tgrelid = 'fencing.stream_entries'::regclass AND t.tgname = 'fencing_entries_truncate') THEN
        CREATE TRIGGER fencing_entries_truncate BEFORE TRUNCATE ON fencing.stream_entries
            FOR EACH STATEMENT EXECUTE FUNCTION fencing.entries_guard();
    END IF;
    -- Every time the file is applied: a guard disabled since is on again, in every
    -- session_replication_role.
    ALTER TABLE fencing.stream_entries ENABLE ALWAYS TRIGGER fencing_entries_guard;
    ALTER TABLE fencing.stream_entries ENABLE ALWAYS TRIGGER fencing_entries_truncate;
END
$$;
