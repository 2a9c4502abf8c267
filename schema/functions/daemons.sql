-- Daemons: the leader's reconcile pass and the node's side of an assignment's lifecycle
-- (assigning -> active -> revoking -> deleted). Deadlines are decided by this database's clock.

DO $$
BEGIN
    IF to_regtype('fencing.daemon_change') IS NULL THEN
        -- One change a reconcile pass made.
        CREATE TYPE fencing.daemon_change AS (
            daemon     text,
            generation bigint,
            -- assigning | revoking | deleted, or active (a revocation withdrawn)
            state      text,
            node_id    text,
            reason     text
        );
    END IF;
    IF to_regtype('fencing.assignment') IS NULL THEN
        -- One assignment of a node, as the node reads it.
        CREATE TYPE fencing.assignment AS (
            daemon       text,
            generation   bigint,
            -- assigning | active | revoking
            state        text,
            -- Until the acknowledge or drain deadline; null while active.
            remaining_ms bigint
        );
    END IF;
END
$$;

-- The fence of a cluster's assignments.
CREATE OR REPLACE FUNCTION fencing.daemons_resource(cluster_ text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM fencing.check_name('cluster', cluster_);
    IF length(cluster_) > 240 THEN
        RAISE EXCEPTION 'fencing: a cluster with daemons has a name of at most 240 characters, got %', length(cluster_)
            USING ERRCODE = '22023';
    END IF;
    RETURN 'fencing.daemons/' || cluster_;
END
$$;

-- Refuses a null, short (under a second: a node needs time to read and act) or overlong (over
-- an hour) timeout with SQLSTATE 22023.
CREATE OR REPLACE FUNCTION fencing.check_timeout(what text, value interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL OR value < interval '1 second' OR value > interval '1 hour' THEN
        RAISE EXCEPTION 'fencing: % must be 00:00:01 to 01:00:00, got %', what, coalesce(value::text, 'null')
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- Ends the assignment of d (locked by the caller): the daemon waits for a node again.
CREATE OR REPLACE FUNCTION fencing.end_assignment(d fencing.daemons, reason_ text, avoid_ text, term_ bigint,
                                                  now_ timestamptz)
RETURNS fencing.daemon_change
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE fencing.daemons x
       SET state = 'unassigned', node_id = NULL, node_started_at = NULL, reason = reason_, avoid_node = avoid_,
           waiting_since = now_, deadline = NULL, drain_for = NULL, changed_at = now_, term = term_
     WHERE x.cluster = d.cluster AND x.daemon = d.daemon;
    INSERT INTO fencing.daemon_history (cluster, daemon, generation, node_id, state, reason, term, at)
    VALUES (d.cluster, d.daemon, d.generation, d.node_id, 'deleted', reason_, term_, now_);
    RETURN (d.daemon, d.generation, 'deleted', d.node_id, reason_)::fencing.daemon_change;
END
$$;

-- The leader's pass over the daemons of cluster_, run on every heartbeat by owner_, the holder
-- of lease_key_ at term_. Admitted through the fence of fencing.daemons_resource(cluster_), bound
-- to lease_key_ on first use: refused with SQLSTATE ZF409 (nothing changed) unless term_ is the
-- lease's current term and the lease is held. The fence row stays locked until the caller's
-- transaction ends, so a later term's pass runs after this one committed. In order:
--   1. daemons no live node offers and without a node lose their row; daemons offered by a live
--      node and not known yet get one (at most 1000 per cluster);
--   2. assignments of nodes no longer live end (node_expired), and so do assignments not
--      acknowledged by their deadline (ack_timeout) or not drained by theirs (drain_timeout, a
--      deadline that starts when the node first reads the revocation): forced, the next
--      assignment goes to another node when there is one; a revocation not read within
--      ack_timeout is withdrawn (active again, revocation_unread);
--   3. every daemon without a node is assigned to the least-loaded live node that offers it
--      (state assigning, a new generation, acknowledge deadline now + ack_timeout), never to a
--      node that let any assignment's acknowledge time out within the last ack_timeout (a slow
--      or stalled node, a clock the store disagrees with: it would only time out again), and
--      to one that did within the last ten ack timeouts only when no other node offers it;
--   4. when nothing is in flight (no assigning, no revoking), one active daemon is revoked
--      from the busiest node when a node that offers it (and did not time out on it last, nor
--      on any assignment within ten ack timeouts) holds two fewer (rebalance): at most one move
--      per pass, and only moves that narrow the spread, so churn is bounded; it drains within
--      drain_timeout of the node reading it.
-- Each assignment's generation comes from fencing.daemon_generations. At READ COMMITTED only.
-- Returns what it changed.
CREATE OR REPLACE FUNCTION fencing.reconcile_daemons(cluster_ text, lease_key_ text, owner_ text, term_ bigint,
                                                     ack_timeout interval, drain_timeout interval)
RETURNS SETOF fencing.daemon_change
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    resource_ text := fencing.daemons_resource(cluster_);
    now_      timestamptz;
    d         fencing.daemons;
    target    fencing.nodes;
    known_    bigint;
    -- Nodes that let an acknowledge time out within one ack_timeout, and within ten.
    timed_out_now_    text[];
    timed_out_lately_ text[];
BEGIN
    PERFORM fencing.check_name('lease key', lease_key_);
    PERFORM fencing.check_name('owner', owner_);
    PERFORM fencing.check_term(term_);
    PERFORM fencing.check_timeout('ack timeout', ack_timeout);
    PERFORM fencing.check_timeout('drain timeout', drain_timeout);
    -- Which nodes are live is decided on the newest rows and the clock read after the locks: a
    -- snapshot older than a node's last heartbeat would end its assignments while it runs them.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'fencing: the daemons pass decides at READ COMMITTED only, not at % (a snapshot may predate a node''s heartbeat)',
            current_setting('transaction_isolation')
            USING ERRCODE = '0A000';
    END IF;
    -- Only the holder passes, before anything is locked: a term read from a table is not a
    -- leadership.
    IF NOT EXISTS (SELECT 1 FROM fencing.leases l
                    WHERE l.key = lease_key_ AND l.owner = owner_ AND l.term = term_) THEN
        PERFORM nextval('fencing.sql_refusals');
        RAISE EXCEPTION 'fencing: % does not hold lease "%" at term %; the daemons of cluster "%" are not its to change',
            owner_, lease_key_, term_, cluster_
            USING ERRCODE = 'ZF409',
                  DETAIL = format('outcome=not_leader resource=%s presented_term=%s', resource_, term_);
    END IF;
    -- The cluster's fence is made here only (other writers may not create it:
    -- fencing.check_unreserved), bound to the first lease that leads the cluster, for good
    -- (another lease needs the audited fencing.rebind); which lease it is bound to is not said
    -- to others.
    IF NOT EXISTS (SELECT 1 FROM fencing.fences f WHERE f.resource = resource_) THEN
        PERFORM fencing.commit_durably();
        INSERT INTO fencing.fences (resource, max_term, lease_key, updated_at)
        VALUES (resource_, 0, lease_key_, clock_timestamp())
        ON CONFLICT ON CONSTRAINT fences_pkey DO NOTHING;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM fencing.fences f WHERE f.resource = resource_ AND f.lease_key = lease_key_) THEN
        RAISE EXCEPTION 'fencing: the daemons of cluster "%" are led under another lease; an admin moves them with fencing.rebind(%L, lease_key, actor, reason)',
            cluster_, resource_
            USING ERRCODE = '22023';
    END IF;
    -- Raises ZF409 for a leader that lost its lease or was succeeded; holds the fence row.
    PERFORM fencing.admit(resource_, term_);
    -- Nodes act on what this pass writes: it must survive a crash once they can read it.
    PERFORM fencing.commit_durably();

    PERFORM 1 FROM fencing.daemons x WHERE x.cluster = cluster_ ORDER BY x.daemon FOR UPDATE;
    now_ := clock_timestamp();

    -- 1. Daemons without a node that no live node offers any more go (their generations stay
    --    used: the sequence never gives them out again); new ones get a row.
    DELETE FROM fencing.daemons x
     WHERE x.cluster = cluster_ AND x.state = 'unassigned'
       AND NOT EXISTS (SELECT 1 FROM fencing.nodes n
                        WHERE n.cluster = cluster_ AND n.expires_at > now_ AND x.daemon = ANY (n.daemons));
    SELECT count(*) INTO known_ FROM fencing.daemons x WHERE x.cluster = cluster_;
    INSERT INTO fencing.daemons (cluster, daemon, state, term, waiting_since, changed_at)
    SELECT cluster_, o.name, 'unassigned', term_, now_, now_
      FROM (SELECT DISTINCT unnest(n.daemons) AS name
              FROM fencing.nodes n WHERE n.cluster = cluster_ AND n.expires_at > now_) o
     WHERE NOT EXISTS (SELECT 1 FROM fencing.daemons x WHERE x.cluster = cluster_ AND x.daemon = o.name)
     ORDER BY o.name
     LIMIT greatest(0, 1000 - known_)
    ON CONFLICT DO NOTHING;

    -- 2. Forced ends.
    FOR d IN SELECT * FROM fencing.daemons x
              WHERE x.cluster = cluster_ AND x.state <> 'unassigned'
                AND NOT EXISTS (SELECT 1 FROM fencing.nodes n
                                 WHERE n.cluster = cluster_ AND n.node_id = x.node_id
                                   AND n.started_at = x.node_started_at AND n.expires_at > now_)
              ORDER BY x.daemon LOOP
        RETURN NEXT fencing.end_assignment(d, 'node_expired', NULL, term_, now_);
    END LOOP;
    -- A revocation its node has not read within the acknowledge timeout is withdrawn (the node
    -- never heard of it, so it goes on running the daemon): a node that stopped reading its
    -- assignments does not hold up every later rebalance of the cluster.
    FOR d IN SELECT * FROM fencing.daemons x
              WHERE x.cluster = cluster_ AND x.state = 'revoking' AND x.deadline IS NULL
                AND x.changed_at + ack_timeout <= now_
              ORDER BY x.daemon LOOP
        UPDATE fencing.daemons x
           SET state = 'active', reason = 'revocation_unread', drain_for = NULL, term = term_, changed_at = now_
         WHERE x.cluster = cluster_ AND x.daemon = d.daemon;
        INSERT INTO fencing.daemon_history (cluster, daemon, generation, node_id, state, reason, term, at)
        VALUES (cluster_, d.daemon, d.generation, d.node_id, 'active', 'revocation_unread', term_, now_);
        RETURN NEXT (d.daemon, d.generation, 'active', d.node_id, 'revocation_unread')::fencing.daemon_change;
    END LOOP;
    FOR d IN SELECT * FROM fencing.daemons x
              WHERE x.cluster = cluster_ AND x.state IN ('assigning', 'revoking') AND x.deadline IS NOT NULL
                AND x.deadline <= now_
              ORDER BY x.daemon LOOP
        RETURN NEXT fencing.end_assignment(
            d, CASE d.state WHEN 'assigning' THEN 'ack_timeout' ELSE 'drain_timeout' END, d.node_id, term_, now_);
    END LOOP;

    -- 3. Assign (the forced ends above included in what timed out).
    timed_out_lately_ := ARRAY(SELECT DISTINCT h.node_id FROM fencing.daemon_history h
                                WHERE h.cluster = cluster_ AND h.at > now_ - 10 * ack_timeout
                                  AND h.state = 'deleted' AND h.reason = 'ack_timeout' AND h.node_id IS NOT NULL);
    timed_out_now_ := ARRAY(SELECT DISTINCT h.node_id FROM fencing.daemon_history h
                             WHERE h.cluster = cluster_ AND h.at > now_ - ack_timeout
                               AND h.state = 'deleted' AND h.reason = 'ack_timeout' AND h.node_id IS NOT NULL);
    FOR d IN SELECT * FROM fencing.daemons x
              WHERE x.cluster = cluster_ AND x.state = 'unassigned'
              ORDER BY x.waiting_since, x.daemon LOOP
        SELECT n.* INTO target
          FROM fencing.nodes n
         WHERE n.cluster = cluster_ AND n.expires_at > now_ AND d.daemon = ANY (n.daemons)
           -- Never straight back to a node that just let an acknowledge time out.
           AND n.node_id <> ALL (timed_out_now_)
         ORDER BY n.node_id = ANY (timed_out_lately_),
                  n.node_id IS NOT DISTINCT FROM d.avoid_node,
                  (SELECT count(*) FROM fencing.daemons y
                    WHERE y.cluster = cluster_ AND y.node_id = n.node_id AND y.node_started_at = n.started_at),
                  n.node_id
         LIMIT 1;
        CONTINUE WHEN NOT FOUND;
        UPDATE fencing.daemons x
           SET state = 'assigning', generation = nextval('fencing.daemon_generations'), node_id = target.node_id,
               node_started_at = target.started_at, term = term_, deadline = now_ + ack_timeout, changed_at = now_
         WHERE x.cluster = cluster_ AND x.daemon = d.daemon
        RETURNING * INTO d;
        INSERT INTO fencing.daemon_history (cluster, daemon, generation, node_id, state, reason, term, at)
        VALUES (cluster_, d.daemon, d.generation, d.node_id, 'assigning', d.reason, term_, now_);
        RETURN NEXT (d.daemon, d.generation, 'assigning', d.node_id, d.reason)::fencing.daemon_change;
    END LOOP;

    -- 4. Rebalance, one move at a time: none while an assignment or a revocation is in flight
    --    (an unread revocation holds it up for one acknowledge timeout at most: it is withdrawn
    --    then, above). Never from a node that had a revocation withdrawn within ten acknowledge
    --    timeouts: it does not read its assignments, and asking it again would only churn.
    IF NOT EXISTS (SELECT 1 FROM fencing.daemons x
                    WHERE x.cluster = cluster_ AND x.state IN ('assigning', 'revoking')) THEN
        WITH loads AS (
            SELECT n.node_id, n.started_at, n.daemons,
                   (SELECT count(*) FROM fencing.daemons y
                     WHERE y.cluster = cluster_ AND y.node_id = n.node_id AND y.node_started_at = n.started_at) AS load
              FROM fencing.nodes n
             WHERE n.cluster = cluster_ AND n.expires_at > now_ AND cardinality(n.daemons) > 0
        )
        SELECT x.* INTO d
          FROM fencing.daemons x
          JOIN loads busy ON busy.node_id = x.node_id AND busy.started_at = x.node_started_at
          JOIN loads idle ON x.daemon = ANY (idle.daemons)
         WHERE x.cluster = cluster_ AND x.state = 'active' AND busy.load >= idle.load + 2
           -- Never back to a node it timed out on, nor to one that let any acknowledge time
           -- out lately.
           AND idle.node_id IS DISTINCT FROM x.avoid_node
           AND idle.node_id <> ALL (timed_out_lately_)
           AND NOT EXISTS (SELECT 1 FROM fencing.daemons u
                            WHERE u.cluster = cluster_ AND u.node_id = busy.node_id
                              AND u.node_started_at = busy.started_at
                              AND u.reason = 'revocation_unread' AND u.changed_at > now_ - 10 * ack_timeout)
         ORDER BY busy.load - idle.load DESC, x.daemon
         LIMIT 1;
        IF FOUND THEN
            -- The drain deadline starts when the node reads the revocation (fencing.assignments).
            UPDATE fencing.daemons x
               SET state = 'revoking', reason = 'rebalance', term = term_, deadline = NULL,
                   drain_for = drain_timeout, changed_at = now_
             WHERE x.cluster = cluster_ AND x.daemon = d.daemon;
            INSERT INTO fencing.daemon_history (cluster, daemon, generation, node_id, state, reason, term, at)
            VALUES (cluster_, d.daemon, d.generation, d.node_id, 'revoking', 'rebalance', term_, now_);
            RETURN NEXT (d.daemon, d.generation, 'revoking', d.node_id, 'rebalance')::fencing.daemon_change;
        END IF;
    END IF;

    -- History older than a week goes, a bounded batch per pass.
    DELETE FROM fencing.daemon_history h
     WHERE h.id IN (SELECT o.id FROM fencing.daemon_history o
                     WHERE o.cluster = cluster_ AND o.at < now_ - interval '7 days' LIMIT 1000);
END
$$;

-- The node incarnation incarnation_ of node_id_, when it is the current one (live or not).
CREATE OR REPLACE FUNCTION fencing.node_incarnation(cluster_ text, node_id_ text, incarnation_ text)
RETURNS fencing.nodes
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    node_ fencing.nodes;
BEGIN
    PERFORM fencing.check_name('cluster', cluster_);
    PERFORM fencing.check_name('node id', node_id_);
    PERFORM fencing.check_name('incarnation', incarnation_);
    SELECT * INTO node_ FROM fencing.nodes n
     WHERE n.cluster = cluster_ AND n.node_id = node_id_ AND n.incarnation = incarnation_;
    RETURN node_;
END
$$;

-- A node's side: offers the daemons it can run (at most 100 names; recorded only while the
-- node is live as incarnation_, written only when they changed) and returns its assignments
-- (none when it is not live as incarnation_). A revocation read for the first time gets its
-- drain deadline now.
CREATE OR REPLACE FUNCTION fencing.assignments(cluster_ text, node_id_ text, incarnation_ text, offered text[])
RETURNS SETOF fencing.assignment
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    node_   fencing.nodes := fencing.node_incarnation(cluster_, node_id_, incarnation_);
    sorted_ text[];
    name_   text;
BEGIN
    IF offered IS NULL OR cardinality(offered) > 100 THEN
        RAISE EXCEPTION 'fencing: a node offers at most 100 daemons' USING ERRCODE = '22023';
    END IF;
    FOREACH name_ IN ARRAY offered LOOP
        PERFORM fencing.check_name('daemon', name_);
    END LOOP;
    IF node_.node_id IS NULL OR node_.expires_at <= clock_timestamp() THEN
        RETURN;
    END IF;
    sorted_ := ARRAY(SELECT DISTINCT o FROM unnest(offered) o ORDER BY o);
    IF node_.daemons IS DISTINCT FROM sorted_ THEN
        UPDATE fencing.nodes n SET daemons = sorted_
         WHERE n.cluster = cluster_ AND n.node_id = node_id_ AND n.incarnation = incarnation_;
    END IF;
    -- A revocation's drain time starts now that the node hears of it.
    IF EXISTS (SELECT 1 FROM fencing.daemons x
                WHERE x.cluster = cluster_ AND x.node_id = node_id_ AND x.node_started_at = node_.started_at
                  AND x.state = 'revoking' AND x.deadline IS NULL) THEN
        PERFORM fencing.commit_durably();
        UPDATE fencing.daemons x SET deadline = clock_timestamp() + x.drain_for
         WHERE x.cluster = cluster_ AND x.node_id = node_id_ AND x.node_started_at = node_.started_at
           AND x.state = 'revoking' AND x.deadline IS NULL;
    END IF;
    -- A revocation committed since the update above has no drain deadline yet: it is reported
    -- as still active, and read as revoking (with its deadline) next time.
    RETURN QUERY
        SELECT x.daemon, x.generation,
               CASE WHEN x.state = 'revoking' AND x.deadline IS NULL THEN 'active' ELSE x.state END,
               CASE WHEN x.deadline IS NULL THEN NULL ELSE fencing.remaining_ms(x.deadline, clock_timestamp()) END
          FROM fencing.daemons x
         WHERE x.cluster = cluster_ AND x.node_id = node_id_ AND x.node_started_at = node_.started_at
         ORDER BY x.daemon;
END
$$;

-- A node acknowledges assignment generation_ of daemon_: from then on it runs the daemon.
-- Accepted only while the assignment is still assigning to this live incarnation and before its
-- deadline; returns how long the daemon waited for a node (ms), or null when refused.
CREATE OR REPLACE FUNCTION fencing.ack_daemon(cluster_ text, node_id_ text, incarnation_ text, daemon_ text,
                                              generation_ bigint)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    node_ fencing.nodes := fencing.node_incarnation(cluster_, node_id_, incarnation_);
    now_  timestamptz := clock_timestamp();
    d     fencing.daemons;
BEGIN
    PERFORM fencing.check_name('daemon', daemon_);
    IF node_.node_id IS NULL OR node_.expires_at <= now_ THEN
        RETURN NULL;
    END IF;
    -- The node starts the daemon on this answer: it must survive a crash.
    PERFORM fencing.commit_durably();
    UPDATE fencing.daemons x SET state = 'active', deadline = NULL, changed_at = now_
     WHERE x.cluster = cluster_ AND x.daemon = daemon_ AND x.generation = generation_ AND x.state = 'assigning'
       AND x.node_id = node_id_ AND x.node_started_at = node_.started_at AND x.deadline > now_
    RETURNING * INTO d;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO fencing.daemon_history (cluster, daemon, generation, node_id, state, reason, term, at)
    VALUES (cluster_, daemon_, generation_, node_id_, 'active', NULL, d.term, now_);
    RETURN greatest(0, floor(extract(epoch FROM (now_ - d.waiting_since)) * 1000))::bigint;
END
$$;

-- A node says its instance of assignment generation_ of daemon_ stopped: drained after a
-- revocation (reason drained), or given back (released; the next assignment goes elsewhere when
-- it can). Accepted from the incarnation the assignment is to, live or not; whether it ended.
CREATE OR REPLACE FUNCTION fencing.daemon_stopped(cluster_ text, node_id_ text, incarnation_ text, daemon_ text,
                                                  generation_ bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    node_ fencing.nodes := fencing.node_incarnation(cluster_, node_id_, incarnation_);
    d     fencing.daemons;
BEGIN
    PERFORM fencing.check_name('daemon', daemon_);
    IF node_.node_id IS NULL THEN
        RETURN false;
    END IF;
    SELECT * INTO d FROM fencing.daemons x
     WHERE x.cluster = cluster_ AND x.daemon = daemon_ AND x.generation = generation_
       AND x.node_id = node_id_ AND x.node_started_at = node_.started_at
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM fencing.end_assignment(d, CASE d.state WHEN 'revoking' THEN 'drained' ELSE 'released' END,
                                   CASE d.state WHEN 'revoking' THEN NULL ELSE node_id_ END, d.term,
                                   clock_timestamp());
    RETURN true;
END
$$;

-- Every daemon of cluster_ and its assignment, by name (at most 1000, all a cluster may have).
CREATE OR REPLACE FUNCTION fencing.daemon_states(cluster_ text)
RETURNS TABLE (daemon text, state text, generation bigint, node_id text, term bigint, reason text,
               changed_at timestamptz, remaining_ms bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM fencing.check_name('cluster', cluster_);
    RETURN QUERY
        SELECT x.daemon, x.state, x.generation, x.node_id, x.term, x.reason, x.changed_at,
               CASE WHEN x.deadline IS NULL THEN NULL ELSE fencing.remaining_ms(x.deadline, clock_timestamp()) END
          FROM fencing.daemons x
         WHERE x.cluster = cluster_
         ORDER BY x.daemon
         LIMIT 1000;
END
$$;
