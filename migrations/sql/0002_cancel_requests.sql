-- A cancellation asked of a run that a live executor holds: the executor
-- stops at its next phase boundary and marks the run cancelled.
ALTER TABLE ratchet.runs ADD COLUMN cancel_requested_at timestamptz;

-- Listing runs newest first, per tenant, by keyset on id.
CREATE INDEX runs_tenant_id_idx ON ratchet.runs (tenant, id DESC);
