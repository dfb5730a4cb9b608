-- Sagas and unknown outcomes (docs/compensation.md).
--
-- A run that fails permanently or is cancelled before its pivot undoes what
-- it did: it becomes 'compensating' (unfinished; its error holds the cause)
-- and runs the registered compensations as journaled phases of kind
-- 'compensation', then finishes 'compensated'.
ALTER TABLE ratchet.runs DROP CONSTRAINT runs_status_check;
ALTER TABLE ratchet.runs ADD CONSTRAINT runs_status_check CHECK (status IN
    ('pending', 'running', 'waiting', 'compensating', 'succeeded', 'failed', 'cancelled', 'compensated'));
ALTER TABLE ratchet.runs DROP CONSTRAINT runs_finished_consistent;
ALTER TABLE ratchet.runs ADD CONSTRAINT runs_finished_consistent CHECK (
    (status IN ('succeeded', 'failed', 'cancelled', 'compensated')) = (finished_at IS NOT NULL));

-- The pivot: the name of the phase after which the run only goes forward.
-- Written by that phase's own fenced commit, so a cancellation (which
-- checks it under the same row lock) is either refused or compensates.
ALTER TABLE ratchet.runs ADD COLUMN pivot text;

-- A phase whose undo was registered when it committed: a cancellation of
-- a run that holds one compensates instead of stopping.
ALTER TABLE ratchet.phases ADD COLUMN compensable boolean NOT NULL DEFAULT false;
ALTER TABLE ratchet.phases DROP CONSTRAINT phases_kind_check;
ALTER TABLE ratchet.phases ADD CONSTRAINT phases_kind_check CHECK (kind IN
    ('atomic', 'step', 'sleep', 'signal', 'compensation'));

-- A run parked for an operator — a compensation that failed permanently,
-- a step whose outcome only reconciliation can tell — waits with nothing
-- to wake it (waiting_for set, no lease, next_attempt_at NULL), whatever
-- its status: it is never due until an operator resumes it. (Before, only
-- a 'waiting' run could be parked without a wake time. A woken run being
-- executed keeps its waiting_for until the phase commits, but holds a
-- lease: it stays due when that lease expires.)
DROP INDEX ratchet.runs_due_idx;
ALTER TABLE ratchet.runs DROP COLUMN due_at;
ALTER TABLE ratchet.runs ADD COLUMN due_at timestamptz GENERATED ALWAYS AS (
    CASE WHEN finished_at IS NULL AND NOT (waiting_for IS NOT NULL AND lease_expires_at IS NULL AND next_attempt_at IS NULL)
        THEN coalesce(greatest(lease_expires_at, next_attempt_at), updated_at)
    END) STORED;
CREATE INDEX runs_due_idx ON ratchet.runs (due_at) WHERE due_at IS NOT NULL;
