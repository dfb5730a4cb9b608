-- How many times in a row a run has failed retryably with the same error
-- (its code, and its message but for the numbers in it): a run retrying the same failure for ever is not a
-- run making progress, and operators alert on it (docs/observability.md).
-- Written by the release after a retryable failure; any other outcome
-- leaves it as the last streak.
ALTER TABLE ratchet.runs ADD COLUMN error_streak integer NOT NULL DEFAULT 0;
