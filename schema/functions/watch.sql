-- Watch (schema version 13): the revisions of leases and of clusters' members, kept by
-- triggers, and the wake-up each change sends on channel fencing_watch when it commits
-- ('lease:<key>', 'nodes:<cluster>'). A watcher reads a state and its revision, and waits for
-- a wake-up, for the instant the state ends by the store's clock, or for its poll, whichever
-- comes first: a lost wake-up only delays an answer.

-- Before each insert or update of a lease: a change a reader can see (a new term or holder, a
-- value, a handover request, a release or force-release: a held lease that a write ends, or an
-- ended one held again)
-- takes the next revision; a renewal (another expires_at, held before and after) keeps it. No side effect here: a
-- BEFORE INSERT trigger also runs for the row of an INSERT ... ON CONFLICT DO NOTHING that
-- inserts nothing.
CREATE OR REPLACE FUNCTION fencing.lease_changed() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.revision := 1;
    ELSIF (NEW.owner, NEW.term, NEW.value, NEW.value_term, NEW.resign_term, NEW.resign_successor, NEW.reserved_for)
          IS DISTINCT FROM (OLD.owner, OLD.term, OLD.value, OLD.value_term, OLD.resign_term, OLD.resign_successor, OLD.reserved_for)
          OR (OLD.expires_at > now_) <> (NEW.expires_at > now_) THEN
        NEW.revision := OLD.revision + 1;
    ELSE
        NEW.revision := OLD.revision;
    END IF;
    RETURN NEW;
END
$$;

-- After a lease row was inserted or took a new revision: wake its watchers when this commits,
-- and commit durably (a revision a watcher saw is never given to another state after a crash).
CREATE OR REPLACE FUNCTION fencing.lease_notify() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.revision <> OLD.revision THEN
        PERFORM fencing.commit_durably();
        PERFORM pg_notify('fencing_watch', 'lease:' || NEW.key);
    END IF;
    RETURN NULL;
END
$$;

-- Before each insert or update of a node: gone (it left) follows expires_at when a statement
-- moves it (a heartbeat, a leave).
CREATE OR REPLACE FUNCTION fencing.node_gone() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.expires_at IS DISTINCT FROM OLD.expires_at THEN
        NEW.gone := NEW.expires_at <= clock_timestamp();
    END IF;
    RETURN NEW;
END
$$;

-- After each insert, update or delete of a node: a join, a leave, a change of its name,
-- metadata, incarnation or start move the cluster's revision and wake its watchers; a heartbeat
-- that only extends a live node does not. The members' revision (fencing.nodes_revision) is
-- this count plus the nodes that ran out without a leave, counted when read, so an expiry is a
-- change without a write. A node that ran out and comes back (or whose row is removed) leaves
-- that second count: it moves the count here by two (or one), so the sum still moves exactly
-- when the live members change. The cluster's row is locked after the node's, in every
-- statement that changes nodes: no two sessions wait for each other.
CREATE OR REPLACE FUNCTION fencing.node_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cluster_ text;
    step_    bigint := 1;
    now_     timestamptz := clock_timestamp();
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.gone THEN
            RETURN NULL;
        END IF;
        cluster_ := OLD.cluster;
    ELSIF TG_OP = 'UPDATE' AND NOT OLD.gone AND OLD.expires_at <= now_ AND NEW.expires_at > now_ THEN
        -- A node that ran out without a leave is live again: it leaves the second count.
        cluster_ := NEW.cluster;
        step_ := 2;
    ELSIF TG_OP = 'UPDATE'
          AND OLD.gone = NEW.gone
          AND (NEW.incarnation, NEW.name, NEW.metadata, NEW.started_at)
              IS NOT DISTINCT FROM (OLD.incarnation, OLD.name, OLD.metadata, OLD.started_at) THEN
        RETURN NULL;
    ELSE
        cluster_ := NEW.cluster;
    END IF;
    PERFORM fencing.commit_durably();
    INSERT INTO fencing.clusters AS c (cluster, revision) VALUES (cluster_, step_)
    ON CONFLICT (cluster) DO UPDATE SET revision = c.revision + step_;
    PERFORM pg_notify('fencing_watch', 'nodes:' || cluster_);
    RETURN NULL;
END
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger t
                    WHERE t.tgrelid = 'fencing.leases'::regclass AND t.tgname = 'fencing_lease_changed') THEN
        CREATE TRIGGER fencing_lease_changed BEFORE INSERT OR UPDATE ON fencing.leases
            FOR EACH ROW EXECUTE FUNCTION fencing.lease_changed();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger t
                    WHERE t.tgrelid = 'fencing.leases'::regclass AND t.tgname = 'fencing_lease_notify') THEN
        CREATE TRIGGER fencing_lease_notify AFTER INSERT OR UPDATE ON fencing.leases
            FOR EACH ROW EXECUTE FUNCTION fencing.lease_notify();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger t
                    WHERE t.tgrelid = 'fencing.nodes'::regclass AND t.tgname = 'fencing_node_gone') THEN
        CREATE TRIGGER fencing_node_gone BEFORE INSERT OR UPDATE ON fencing.nodes
            FOR EACH ROW EXECUTE FUNCTION fencing.node_gone();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger t
                    WHERE t.tgrelid = 'fencing.nodes'::regclass AND t.tgname = 'fencing_node_changed') THEN
        CREATE TRIGGER fencing_node_changed AFTER INSERT OR UPDATE OR DELETE ON fencing.nodes
            FOR EACH ROW EXECUTE FUNCTION fencing.node_changed();
    END IF;
END
$$;
-- Also in a session replaying changes (session_replication_role = replica), like the guard.
ALTER TABLE fencing.leases ENABLE ALWAYS TRIGGER fencing_lease_changed;
ALTER TABLE fencing.leases ENABLE ALWAYS TRIGGER fencing_lease_notify;
ALTER TABLE fencing.nodes ENABLE ALWAYS TRIGGER fencing_node_gone;
ALTER TABLE fencing.nodes ENABLE ALWAYS TRIGGER fencing_node_changed;

-- One lease as a watcher sees it: fencing.read_lease's columns and the revision of this
-- state, 2 * the row's revision, plus 1 once the lease has ended by the store's clock (its
-- expiry writes nothing, yet is a change). No row for a key never acquired (revision 0).
-- Schema version 14 adds the handover: resign_requested (asked of the current term while held),
-- successor (the one named in that request, or the one the next term is reserved for) and
-- reserved_ms (what is left of that reservation).
CREATE OR REPLACE FUNCTION fencing.observe_lease(lease_key text)
RETURNS TABLE (key text, owner text, term bigint, acquired_at timestamptz, renewed_at timestamptz,
               expires_at timestamptz, remaining_ms bigint, value text, lock_delay_ms bigint, revision bigint,
               resign_requested boolean, successor text, reserved_ms bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
BEGIN
    PERFORM fencing.check_name('lease key', lease_key);
    RETURN QUERY
        SELECT l.key, l.owner, l.term, l.acquired_at, l.renewed_at, l.expires_at,
               fencing.remaining_ms(l.expires_at, now_), fencing.lease_value(l)::text,
               fencing.lock_delay_left(l, now_),
               2 * l.revision + CASE WHEN l.expires_at <= now_ THEN 1 ELSE 0 END,
               coalesce(l.resign_term = l.term AND l.expires_at > now_, false),
               -- Kept once the reservation lapsed (reserved_ms 0): its end writes nothing.
               CASE WHEN l.expires_at > now_ AND l.resign_term = l.term THEN l.resign_successor
                    WHEN l.expires_at <= now_ THEN l.reserved_for END,
               CASE WHEN l.expires_at <= now_ AND l.reserved_until > now_
                    THEN fencing.remaining_ms(l.reserved_until, now_) ELSE 0 END
          FROM fencing.leases l WHERE l.key = lease_key;
END
$$;

-- The revision of `cluster_`'s members (0 for a cluster never seen): the cluster's count of
-- changes (fencing.node_changed) plus its nodes that ran out without a leave, so it moves when
-- a node runs out though nothing is written then; and how long until the next live node runs
-- out by the store's clock (NULL with none). Read it before the members, and a change between
-- the two shows as a later revision, never as a missed one. The nodes that ran out are counted
-- under a share lock, so a heartbeat of one of them that is committing is waited for and seen
-- (it may have left the cluster's count unchanged, having begun before the node ran out).
CREATE OR REPLACE FUNCTION fencing.nodes_revision(cluster_ text)
RETURNS TABLE (revision bigint, next_expiry_ms bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_     timestamptz := clock_timestamp();
    ran_out_ bigint;
BEGIN
    PERFORM fencing.check_name('cluster', cluster_);
    SELECT count(*) INTO ran_out_
      FROM (SELECT 1 FROM fencing.nodes n
             WHERE n.cluster = cluster_ AND NOT n.gone AND n.expires_at <= now_
               FOR SHARE) ran_out;
    RETURN QUERY
        SELECT coalesce((SELECT c.revision FROM fencing.clusters c WHERE c.cluster = cluster_), 0) + ran_out_,
               (SELECT fencing.remaining_ms(x.next, clock_timestamp())
                  FROM (SELECT min(n.expires_at) AS next FROM fencing.nodes n
                         WHERE n.cluster = cluster_ AND n.expires_at > clock_timestamp()) x
                 WHERE x.next IS NOT NULL);
END
$$;

-- The live nodes of `cluster_` for a node that read them last at revision `known_` (NULL:
-- never), in one read whose cost follows the changes, not the members (schema version 15):
--   - one row (revision, and node_id NULL) while the members' revision is still known_;
--   - else a row per node live at the instant the revision is of, by node id, each with the
--     revision (one row with node_id NULL when there is none);
--   - no row at all when it cannot read without waiting for a lock: the caller reads again at
--     its next heartbeat (its heartbeat, in the same transaction, stands).
-- The revision is fencing.nodes_revision's, but this waits for no lock, so a node's heartbeat
-- transaction can read it after its heartbeat. First it marks the nodes that ran out without a
-- leave as gone: their end is counted in the cluster's count from then on (fencing.node_changed)
-- instead of when read, which leaves the revision as it was and lets the next reads skip them.
-- It marks only when it gets the cluster's row at once, and skips a node whose row is locked (a
-- heartbeat of it is committing, or another reader marks it); while such a node is left
-- unmarked the revision is NULL (not known: the members are returned), since its outcome may or
-- may not move the revision. The members are those live at the revision's instant (now_) and
-- not gone since (a leave, or a mark, after now_ is counted in the revision read after it), read
-- after the revision, so a change in between shows as a later revision, never as a missed one.
CREATE OR REPLACE FUNCTION fencing.members_since(cluster_ text, known_ bigint)
RETURNS TABLE (revision bigint, node_id text, name text, started_at timestamptz, heartbeat_at timestamptz,
               expires_at timestamptz, remaining_ms bigint, metadata text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_      timestamptz := clock_timestamp();
    ran_out_  bigint;
    revision_ bigint;
BEGIN
    PERFORM fencing.check_name('cluster', cluster_);
    BEGIN
        IF EXISTS (SELECT 1 FROM fencing.nodes n
                    WHERE n.cluster = cluster_ AND NOT n.gone AND n.expires_at <= now_) THEN
            PERFORM 1 FROM fencing.clusters c WHERE c.cluster = cluster_ FOR UPDATE NOWAIT;
            IF FOUND THEN
                UPDATE fencing.nodes n SET gone = true
                 WHERE (n.cluster, n.node_id) IN (SELECT o.cluster, o.node_id FROM fencing.nodes o
                                                   WHERE o.cluster = cluster_ AND NOT o.gone
                                                     AND o.expires_at <= now_
                                                     FOR UPDATE SKIP LOCKED);
            END IF;
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RETURN;
    END;
    -- One snapshot for both, our marks included: what is left ran out unmarked.
    SELECT (SELECT count(*) FROM fencing.nodes n
             WHERE n.cluster = cluster_ AND NOT n.gone AND n.expires_at <= now_),
           coalesce((SELECT c.revision FROM fencing.clusters c WHERE c.cluster = cluster_), 0)
      INTO ran_out_, revision_;
    revision_ := CASE WHEN ran_out_ = 0 THEN revision_ END;
    IF revision_ IS NOT NULL AND revision_ = known_ THEN
        RETURN QUERY SELECT revision_, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz,
                            NULL::timestamptz, NULL::bigint, NULL::text;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT revision_, n.node_id, n.name, n.started_at, n.heartbeat_at, n.expires_at,
               fencing.remaining_ms(n.expires_at, clock_timestamp()), n.metadata::text
          FROM fencing.nodes n
         WHERE n.cluster = cluster_ AND n.expires_at > now_ AND NOT n.gone
         ORDER BY n.node_id
         LIMIT 1000;
    IF NOT FOUND THEN
        RETURN QUERY SELECT revision_, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz,
                            NULL::timestamptz, NULL::bigint, NULL::text;
    END IF;
END
$$;

-- A cluster's members as a watcher sees them (schema version 15), in one call: the revision
-- as fencing.nodes_revision gives it (a heartbeat of a node that ran out and is committing is
-- waited for, under a share lock), how long until the next live node runs out (NULL with
-- none), and the nodes live at the revision's instant and not gone since, by node id, each row
-- with both (one row with node_id NULL when there is none). Listing the nodes live at that
-- instant, not at a later one, is what keeps a node whose heartbeat began before its expiry
-- and committed after it: it was live at the instant the revision is of, and is live after.
CREATE OR REPLACE FUNCTION fencing.observe_members(cluster_ text)
RETURNS TABLE (revision bigint, next_expiry_ms bigint, node_id text, name text, started_at timestamptz,
               heartbeat_at timestamptz, expires_at timestamptz, remaining_ms bigint, metadata text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_      timestamptz := clock_timestamp();
    ran_out_  bigint;
    revision_ bigint;
    next_     timestamptz;
BEGIN
    PERFORM fencing.check_name('cluster', cluster_);
    SELECT count(*) INTO ran_out_
      FROM (SELECT 1 FROM fencing.nodes n
             WHERE n.cluster = cluster_ AND NOT n.gone AND n.expires_at <= now_
               FOR SHARE) ran_out;
    revision_ := coalesce((SELECT c.revision FROM fencing.clusters c WHERE c.cluster = cluster_), 0) + ran_out_;
    SELECT min(n.expires_at) INTO next_ FROM fencing.nodes n
     WHERE n.cluster = cluster_ AND n.expires_at > clock_timestamp();
    RETURN QUERY
        SELECT revision_, CASE WHEN next_ IS NOT NULL THEN fencing.remaining_ms(next_, clock_timestamp()) END,
               n.node_id, n.name, n.started_at, n.heartbeat_at, n.expires_at,
               fencing.remaining_ms(n.expires_at, clock_timestamp()), n.metadata::text
          FROM fencing.nodes n
         WHERE n.cluster = cluster_ AND n.expires_at > now_ AND NOT n.gone
         ORDER BY n.node_id
         LIMIT 1000;
    IF NOT FOUND THEN
        RETURN QUERY SELECT revision_, CASE WHEN next_ IS NOT NULL THEN fencing.remaining_ms(next_, clock_timestamp()) END,
                            NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                            NULL::bigint, NULL::text;
    END IF;
END
$$;
