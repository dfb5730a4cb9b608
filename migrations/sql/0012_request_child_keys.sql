-- Child keys of format 3 (steps.ChildKeyV3) derive from the request (the
-- tenant and its idempotency key) rather than from the run's id, so that a
-- run whose creation was lost in a failover, created again by the client's
-- retry, sends the keys the lost one sent. A key carries the request's
-- digest; the run behind it is found through key_digest.

-- The request's digest, as steps.RequestDigest computes it (golden vectors
-- pin both): the first 16 bytes of SHA-256 over a domain, a zero byte, and
-- each field as its length in 4 bytes big-endian followed by its UTF-8
-- bytes.
CREATE FUNCTION ratchet.request_digest(tenant text, idempotency_key text) RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN substring(sha256('ratchet/request/v3'::bytea || '\x00'::bytea
        || int4send(octet_length(convert_to(tenant, 'UTF8'))) || convert_to(tenant, 'UTF8')
        || int4send(octet_length(convert_to(idempotency_key, 'UTF8'))) || convert_to(idempotency_key, 'UTF8'))
        FROM 1 FOR 16);

ALTER TABLE ratchet.runs DROP CONSTRAINT runs_key_format_check;
ALTER TABLE ratchet.runs ADD CONSTRAINT runs_key_format_check CHECK (key_format IN (1, 2, 3));

-- Only runs of format 3 have a digest (and an entry in its index), which
-- the claim that creates the run computes with request_digest. Adding the
-- column rewrites no row.
ALTER TABLE ratchet.runs ADD COLUMN key_digest bytea;
ALTER TABLE ratchet.runs ADD CONSTRAINT runs_key_digest_check CHECK ((key_format = 3) = (key_digest IS NOT NULL));
CREATE INDEX runs_key_digest_idx ON ratchet.runs (key_digest) WHERE key_digest IS NOT NULL;

-- The index of every key sent holds keys of format 1 only: keys of format
-- 2 name their run, and those of format 3 their request. Rebuilding it
-- takes a few seconds per million phases, during which phases cannot be
-- written (as 0011's did).
DROP INDEX ratchet.phases_child_key_idx;
CREATE INDEX phases_child_key_idx ON ratchet.phases (child_key) WHERE child_key LIKE 'rk1\_%';
