-- fencing-gateway schema, version 10: every settle has an identity (fences.settle_id).
--
-- A gateway ends a settle it has seen pass with fencing.mark_settled, and a settle it has seen
-- drain with fencing.mark_drained. Before this version those calls named the settle by the
-- fence's term, binding and length. A rebinding away and back (rebind k -> j -> k at one term),
-- or a reset and a raise of an unbound fence, can start a settle equal to an older one in all
-- three, so a mark of the older settle sent late (its gateway's decision was answered just within
-- the check timeout) could end the newer one before its writes of the previous binding or term
-- had passed their deadlines (S5). Now:
--   - fencing.settle_ids: a sequence; every change of a fence's term or binding (a raise through
--     fencing.gate or fencing.admit, advance_fence, bind of an unbound fence, rebind,
--     reset_fence) takes the next value;
--   - fences.settle_id: the settle the row's settle_ms and drain_ms belong to;
--   - gate_result.settle_id: the settle a decision's wait belongs to;
--   - fencing.mark_settled and fencing.mark_drained take it as a fifth argument and change only
--     that settle. The four-argument versions are dropped: a gateway of an older version can no
--     longer mark settles (slower, never unsafe: see the README's upgrade note).
--
-- Apply with psql in one transaction together with every file of schema/functions/ in name order
-- (see the README).

CREATE SEQUENCE IF NOT EXISTS fencing.settle_ids AS bigint;

ALTER TABLE fencing.fences ADD COLUMN IF NOT EXISTS settle_id bigint NULL;

COMMENT ON COLUMN fencing.fences.settle_id IS
    'The settle settle_ms and drain_ms belong to: a new value at every change of max_term or lease_key (fencing.mark_settled and fencing.mark_drained name it).';

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                    WHERE attrelid = 'fencing.gate_result'::regclass AND attname = 'settle_id' AND NOT attisdropped) THEN
        ALTER TYPE fencing.gate_result ADD ATTRIBUTE settle_id bigint;
    END IF;
    -- A settle or a drain pending from version 9 gets a name now. The next decisions of gateways
    -- of this version name a pending settle and can mark it; a pending drain was marked settled
    -- already, so no decision names it any more: it stays until the next term change, which
    -- settles behind it once more (a cost, never a shortened wait).
    UPDATE fencing.fences SET settle_id = nextval('fencing.settle_ids')
     WHERE settle_id IS NULL AND (settle_ms IS NOT NULL OR drain_ms IS NOT NULL);
    IF to_regprocedure('fencing.mark_settled(text, bigint, text, bigint)') IS NOT NULL THEN
        DROP FUNCTION fencing.mark_settled(text, bigint, text, bigint);
    END IF;
    IF to_regprocedure('fencing.mark_drained(text, bigint, text, bigint)') IS NOT NULL THEN
        DROP FUNCTION fencing.mark_drained(text, bigint, text, bigint);
    END IF;
END
$$;

INSERT INTO fencing.schema_migrations (version, name) VALUES (10, 'settle_ids')
ON CONFLICT (version) DO NOTHING;
