-- How many of a run's executions failed: ended in a retryable error (the
-- release for a retry counts it) or were lost, their lease expiring with
-- an owner still on it (the takeover that follows counts it). attempt
-- counts every execution, a wake from a sleep, a signal or a child and a
-- claim that found the key's slot taken included; a retry policy's
-- MaxAttempts bounds failures, so that waiting never spends a retry.
--
-- Runs that failed before this release start at 0: their earlier failures
-- were not told apart from their wakes.
ALTER TABLE ratchet.runs ADD COLUMN failures integer NOT NULL DEFAULT 0;
