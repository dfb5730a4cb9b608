-- One index finds a run by its request, for both questions asked of it:
-- "does this idempotency key exist?" (the claim's conflict, every lookup
-- by key) and "which run sent this format-3 child key?" (the key carries
-- the request's digest). Its entries are the 16-byte digest, whatever the
-- key's length: 60% of the (tenant, idempotency_key) index's bytes for
-- keys of 38 characters, and one random leaf per run where format 3 had
-- two (that index's and runs_key_digest_idx's). Two keys of a tenant that
-- share a digest would be one request; with 128 bits, as for child keys,
-- that does not happen.
--
-- This migration only adds: processes of the previous release keep their
-- (tenant, idempotency_key) constraint and key_digest until 0014, a
-- contract migration, drops them once no such process is left
-- (docs/engine.md, "Upgrading"). Building the index takes writes to runs
-- away for its duration (about 2.5 s per million runs); on a large table,
-- build it first with CREATE UNIQUE INDEX CONCURRENTLY under this name,
-- and this statement finds it there.
CREATE UNIQUE INDEX IF NOT EXISTS runs_request_unique ON ratchet.runs (ratchet.request_digest(tenant, idempotency_key));

-- Runs created by this release carry no key_digest: the index above
-- computes it.
ALTER TABLE ratchet.runs DROP CONSTRAINT runs_key_digest_check;
