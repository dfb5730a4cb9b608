-- ratchet:contract
--
-- Drops what only releases before 0013's needed: the (tenant,
-- idempotency_key) unique constraint that their claims name in ON CONFLICT,
-- and the stored request digest with its index, which runs_request_unique
-- replaces. Apply it once every process runs a release that has 0013
-- (`ratchet migrate --keep-compatible` stops before it).
ALTER TABLE ratchet.runs DROP CONSTRAINT runs_tenant_key_unique;
DROP INDEX ratchet.runs_key_digest_idx;
ALTER TABLE ratchet.runs DROP COLUMN key_digest;
