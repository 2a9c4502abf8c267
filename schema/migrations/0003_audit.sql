-- fencing-gateway schema, version 3: the record of refused writes, and audited admin actions.
--
-- Apply with psql in one transaction:
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 --single-transaction -f 0003_audit.sql

-- Writes the gateway refused (stale, not the leader, future term), kept for incident review:
-- proof of what was stopped. Bounded: fencing.record_refusals keeps the newest rows only.
CREATE TABLE IF NOT EXISTS fencing.refusals (
    id             bigserial   PRIMARY KEY,
    at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    resource       text        NOT NULL,
    route          text        NULL,
    outcome        text        NOT NULL,
    presented_term bigint      NULL,
    current_term   bigint      NULL,
    gateway        text        NULL
);
CREATE INDEX IF NOT EXISTS refusals_resource_at ON fencing.refusals (resource, at DESC);

-- Every hand-made change to a lease or a fence: who, what, why, and what it was before.
CREATE TABLE IF NOT EXISTS fencing.admin_audit (
    id     bigserial   PRIMARY KEY,
    at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor  text        NOT NULL,
    action text        NOT NULL,
    target text        NOT NULL,
    reason text        NOT NULL,
    before jsonb       NULL,
    after  jsonb       NULL
);

-- Appends refused writes (arrays of one length) and keeps only the newest `keep` rows. The
-- record is for review, not for decisions: it commits without waiting for the WAL flush.
CREATE OR REPLACE FUNCTION fencing.record_refusals(resources text[], routes text[], outcomes text[],
                                                   presented_terms bigint[], current_terms bigint[],
                                                   gateway text, keep integer DEFAULT 10000)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF keep IS NULL OR keep < 1 THEN
        RAISE EXCEPTION 'fencing: keep must be at least 1' USING ERRCODE = '22023';
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO fencing.refusals (resource, route, outcome, presented_term, current_term, gateway)
    SELECT r, ro, o, p, c, gateway
      FROM unnest(resources, routes, outcomes, presented_terms, current_terms) AS t(r, ro, o, p, c)
     WHERE r IS NOT NULL AND o IS NOT NULL;
    DELETE FROM fencing.refusals WHERE id <= (SELECT max(id) - keep FROM fencing.refusals);
END
$$;

-- Ends the current leadership period of key, whoever holds it (a dead owner, after an
-- incident), and records it. The row and its term stay, so the next holder gets term + 1.
CREATE OR REPLACE FUNCTION fencing.force_release(key text, actor text, reason text)
RETURNS fencing.leases
LANGUAGE plpgsql AS $$
DECLARE
    p_key ALIAS FOR key;
    old_  fencing.leases;
    new_  fencing.leases;
BEGIN
    PERFORM fencing.check_name('lease key', p_key);
    PERFORM fencing.check_name('actor', actor);
    PERFORM fencing.check_name('reason', reason);
    SELECT * INTO old_ FROM fencing.leases l WHERE l.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fencing: no lease %', p_key USING ERRCODE = '22023';
    END IF;
    UPDATE fencing.leases l SET expires_at = least(l.expires_at, clock_timestamp())
     WHERE l.key = p_key
    RETURNING * INTO new_;
    INSERT INTO fencing.admin_audit (actor, action, target, reason, before, after)
    VALUES (actor, 'force_release', p_key, reason, to_jsonb(old_), to_jsonb(new_));
    RETURN new_;
END
$$;

-- Raises a fence's maximum by hand after an incident, so that every writer below `term` is
-- refused from now on, and records it. A fence never goes back (S3): a term at or below the
-- maximum is refused with 22023. Gateway writes of the new term settle behind the old horizon.
CREATE OR REPLACE FUNCTION fencing.advance_fence(resource text, term bigint, actor text, reason text)
RETURNS fencing.fences
LANGUAGE plpgsql AS $$
DECLARE
    p_resource ALIAS FOR resource;
    p_term     ALIAS FOR term;
    old_       fencing.fences;
    new_       fencing.fences;
BEGIN
    PERFORM fencing.check_name('resource', p_resource);
    PERFORM fencing.check_term(p_term);
    PERFORM fencing.check_name('actor', actor);
    PERFORM fencing.check_name('reason', reason);
    SELECT * INTO old_ FROM fencing.fences f WHERE f.resource = p_resource FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO fencing.fences AS f (resource, max_term, lease_key, updated_at)
        VALUES (p_resource, p_term, NULL, clock_timestamp())
        RETURNING * INTO new_;
    ELSIF p_term <= old_.max_term THEN
        RAISE EXCEPTION 'fencing: a fence never goes back: "%" is at term %, asked for %',
            p_resource, old_.max_term, p_term
            USING ERRCODE = '22023';
    ELSE
        UPDATE fencing.fences f
           SET max_term = p_term, updated_at = clock_timestamp(),
               settle_at = greatest(f.settle_at, f.horizon), horizon = NULL
         WHERE f.resource = p_resource
        RETURNING * INTO new_;
    END IF;
    INSERT INTO fencing.admin_audit (actor, action, target, reason, before, after)
    VALUES (actor, 'advance_fence', p_resource, reason, to_jsonb(old_), to_jsonb(new_));
    RETURN new_;
END
$$;

INSERT INTO fencing.schema_migrations (version, name) VALUES (3, 'audit')
ON CONFLICT (version) DO NOTHING;
