-- What a parked run waits for: a timer (kind 'sleep', until a time) or,
-- later, a signal. Written when a run parks (status 'waiting', lease
-- released, next_attempt_at = the wake time, so the run is due then by
-- the due_at the recoverers poll), read by the execution that resumes
-- it, and cleared when the waiting phase commits.
ALTER TABLE ratchet.runs ADD COLUMN waiting_for jsonb;

ALTER TABLE ratchet.runs ADD CONSTRAINT runs_waiting_described CHECK (
    status <> 'waiting' OR (waiting_for IS NOT NULL AND lease_owner IS NULL));
