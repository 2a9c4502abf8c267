-- Cluster membership: heartbeat, leave, members. Expiry is decided by this database's clock.

-- The result row of fencing.heartbeat.
DO $$
BEGIN
    IF to_regtype('fencing.heartbeat_result') IS NULL THEN
        CREATE TYPE fencing.heartbeat_result AS (
            ok           boolean,
            incarnation  text,
            started_at   timestamptz,
            expires_at   timestamptz,
            remaining_ms bigint
        );
    END IF;
END
$$;

-- Registers or refreshes node `node_id_` of `cluster_` for `ttl`, as process `incarnation_`.
-- ok = false (and nothing changes; incarnation is null then) while another incarnation holds
-- the id live: two processes
-- configured with one node id never both count as live. A node that was not live (new, left,
-- or expired, this incarnation's own included) joins anew: started_at is now.
-- metadata_ is a JSON object of at most 8 KiB, as text.
CREATE OR REPLACE FUNCTION fencing.heartbeat(
    cluster_ text, node_id_ text, incarnation_ text, name_ text, ttl interval, metadata_ text
) RETURNS fencing.heartbeat_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_ timestamptz;
    meta jsonb;
    held fencing.nodes;
BEGIN
    PERFORM fencing.check_name('cluster', cluster_);
    PERFORM fencing.check_name('node id', node_id_);
    PERFORM fencing.check_name('incarnation', incarnation_);
    PERFORM fencing.check_name('node name', name_);
    PERFORM fencing.check_ttl(ttl);
    IF metadata_ IS NULL OR octet_length(metadata_) > 8192 THEN
        RAISE EXCEPTION 'fencing: node metadata must be a JSON object of at most 8192 bytes'
            USING ERRCODE = '22023';
    END IF;
    BEGIN
        meta := metadata_::jsonb;
    EXCEPTION WHEN others THEN
        RAISE EXCEPTION 'fencing: node metadata is not JSON' USING ERRCODE = '22023';
    END;
    IF jsonb_typeof(meta) <> 'object' THEN
        RAISE EXCEPTION 'fencing: node metadata must be a JSON object, got %', jsonb_typeof(meta)
            USING ERRCODE = '22023';
    END IF;

    -- A heartbeat nobody may lose in a crash: the process acts on it as registered.
    PERFORM fencing.commit_durably();
    -- A cluster holds at most 1000 live nodes: a caller cannot grow it without bound.
    IF NOT EXISTS (SELECT 1 FROM fencing.nodes n
                    WHERE n.cluster = cluster_ AND n.node_id = node_id_ AND n.expires_at > clock_timestamp())
       AND (SELECT count(*) FROM (SELECT 1 FROM fencing.nodes n
                                   WHERE n.cluster = cluster_ AND n.expires_at > clock_timestamp()
                                   LIMIT 1000) live) >= 1000 THEN
        RAISE EXCEPTION 'fencing: cluster % has 1000 live nodes, the most it may have', cluster_
            USING ERRCODE = '22023';
    END IF;
    LOOP
        INSERT INTO fencing.nodes (cluster, node_id, incarnation, name, started_at, heartbeat_at, expires_at, metadata)
        VALUES (cluster_, node_id_, incarnation_, name_, clock_timestamp(), clock_timestamp(), clock_timestamp() + ttl, meta)
        ON CONFLICT (cluster, node_id) DO NOTHING;
        IF FOUND THEN
            SELECT * INTO held FROM fencing.nodes n WHERE n.cluster = cluster_ AND n.node_id = node_id_;
            RETURN (true, held.incarnation, held.started_at, held.expires_at,
                    fencing.remaining_ms(held.expires_at, clock_timestamp()))::fencing.heartbeat_result;
        END IF;
        SELECT * INTO held FROM fencing.nodes n WHERE n.cluster = cluster_ AND n.node_id = node_id_ FOR UPDATE;
        -- Gone between the two (another node's cleanup): insert again.
        EXIT WHEN FOUND;
    END LOOP;
    -- After the lock: the clock the decision is made on.
    now_ := clock_timestamp();
    IF held.expires_at > now_ AND held.incarnation <> incarnation_ THEN
        -- Who holds it is not said: the incarnation is what leave and heartbeat check.
        RETURN (false, NULL, held.started_at, held.expires_at,
                fencing.remaining_ms(held.expires_at, now_))::fencing.heartbeat_result;
    END IF;
    UPDATE fencing.nodes n
       SET incarnation  = incarnation_,
           name         = name_,
           started_at   = CASE WHEN held.expires_at > now_ THEN n.started_at ELSE now_ END,
           heartbeat_at = now_,
           expires_at   = now_ + ttl,
           metadata     = meta,
           -- A node that joins anew offers its daemons anew (fencing.assignments).
           daemons      = CASE WHEN held.expires_at > now_ THEN n.daemons ELSE '{}' END
     WHERE n.cluster = cluster_ AND n.node_id = node_id_
    RETURNING * INTO held;
    -- Other nodes of this cluster gone for a day; rows another heartbeat holds are left alone.
    DELETE FROM fencing.nodes n
     WHERE (n.cluster, n.node_id) IN (
               SELECT o.cluster, o.node_id FROM fencing.nodes o
                WHERE o.cluster = cluster_ AND o.node_id <> node_id_ AND o.expires_at < now_ - interval '1 day'
                  FOR UPDATE SKIP LOCKED);
    RETURN (true, held.incarnation, held.started_at, held.expires_at,
            fencing.remaining_ms(held.expires_at, now_))::fencing.heartbeat_result;
END
$$;

-- Node `node_id_` of `cluster_` leaves now, if incarnation_ holds it live; whether it did.
CREATE OR REPLACE FUNCTION fencing.leave(cluster_ text, node_id_ text, incarnation_ text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM fencing.check_name('cluster', cluster_);
    PERFORM fencing.check_name('node id', node_id_);
    PERFORM fencing.check_name('incarnation', incarnation_);
    UPDATE fencing.nodes n SET expires_at = clock_timestamp()
     WHERE n.cluster = cluster_ AND n.node_id = node_id_ AND n.incarnation = incarnation_
       AND n.expires_at > clock_timestamp();
    RETURN FOUND;
END
$$;

-- The live nodes of `cluster_`, by node id (at most 1000, all a cluster may have).
CREATE OR REPLACE FUNCTION fencing.members(cluster_ text)
RETURNS TABLE (node_id text, name text, started_at timestamptz, heartbeat_at timestamptz,
               expires_at timestamptz, remaining_ms bigint, metadata text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM fencing.check_name('cluster', cluster_);
    RETURN QUERY
        SELECT n.node_id, n.name, n.started_at, n.heartbeat_at, n.expires_at,
               fencing.remaining_ms(n.expires_at, clock_timestamp()), n.metadata::text
          FROM fencing.nodes n
         WHERE n.cluster = cluster_ AND n.expires_at > clock_timestamp()
         ORDER BY n.node_id
         LIMIT 1000;
END
$$;
