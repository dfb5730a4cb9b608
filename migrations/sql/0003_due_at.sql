-- When an unfinished run is next due for an executor: when its lease
-- expires, when its backoff (or, later, its timer) ends, or, for a run that
-- nobody holds and nothing delays, since it was last changed. Derived from
-- the lease and backoff columns, never written: it cannot disagree with them.
-- A finished run is never due (NULL), so the index below holds unfinished
-- runs only and stays small however much history accumulates.
ALTER TABLE ratchet.runs ADD COLUMN due_at timestamptz GENERATED ALWAYS AS (
    CASE WHEN finished_at IS NULL
        THEN coalesce(greatest(lease_expires_at, next_attempt_at), updated_at)
    END) STORED;

-- Every worker process polls this: SELECT … WHERE due_at <= now() ORDER BY due_at.
CREATE INDEX runs_due_idx ON ratchet.runs (due_at) WHERE due_at IS NOT NULL;

-- Superseded by runs_due_idx.
DROP INDEX ratchet.runs_unfinished_idx;

-- Runs were once found through a River job per claim ("looks") and a sweep;
-- the runs table itself is now the only source. Jobs of those kinds left in
-- a database migrated from then would find no worker.
DO $$
BEGIN
    IF to_regclass('ratchet.river_job') IS NOT NULL THEN
        DELETE FROM ratchet.river_job WHERE kind IN ('ratchet.resume', 'ratchet.sweep');
    END IF;
END $$;
