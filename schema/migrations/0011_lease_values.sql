-- fencing-gateway schema, version 11: a leader's value (proclaim and observe).
--
-- A holder may attach a small JSON value to its lease (its address, its version), for followers
-- and clients to find it: fencing.set_lease_value(key, owner, term, value), checked against the
-- holder's term while it holds the lease, so a zombie's call with its old term changes nothing.
-- The value belongs to the term it was set at (value_term): a new term shows no value until its
-- holder sets one, so no reader ever takes the last leader's address for the new leader's.
--
-- Apply with psql in one transaction together with every file of schema/functions/ in name order
-- (see the README).

ALTER TABLE fencing.leases ADD COLUMN IF NOT EXISTS value jsonb NULL;
ALTER TABLE fencing.leases ADD COLUMN IF NOT EXISTS value_term bigint NULL;

COMMENT ON COLUMN fencing.leases.value IS
    'The holder''s value (at most 4096 bytes of JSON), set by fencing.set_lease_value: the value of term value_term only.';
COMMENT ON COLUMN fencing.leases.value_term IS
    'The term value was set at: a value of another term than the lease''s is no value.';

INSERT INTO fencing.schema_migrations (version, name) VALUES (11, 'lease_values')
ON CONFLICT (version) DO NOTHING;
