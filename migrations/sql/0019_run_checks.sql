-- The rules of a run's row that a phase commit cannot break move from
-- CHECK constraints to one trigger that runs only when a statement writes
-- a column they read.
--
-- Why: Postgres checks every CHECK constraint of a table on each INSERT
-- and UPDATE, whatever columns it sets, and rebuilds each one's expression
-- from its stored text for each statement (parse, plan, compile). With
-- eleven on runs that was half of the server's time for a phase commit's
-- UPDATE, which sets none of the columns they guard but waiting_for
-- (docs/performance.md, "What a commit costs Postgres"). A trigger
-- declared UPDATE OF its columns is not even called by a statement that
-- sets none of them, and its checks are compiled once per connection.
--
-- The rules are the same, checked on the same rows: each one reads only
-- the row, so a row can break one only through an INSERT or an UPDATE of
-- a column it reads, and the trigger's column list is every column the
-- rules read. A violation is the same error as before: SQLSTATE 23514
-- naming the constraint it was. runs_waiting_described stays a CHECK
-- constraint: it reads waiting_for, which phase commits set, so the
-- trigger would be called on every one of them.
--
-- Columns unchanged, so every statement of an earlier release works as it
-- did, and nothing is rewritten.

CREATE FUNCTION ratchet.check_run() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    broken text;
BEGIN
    broken := CASE
        WHEN NEW.status NOT IN ('pending', 'running', 'waiting', 'compensating',
            'succeeded', 'failed', 'cancelled', 'compensated') THEN 'runs_status_check'
        WHEN length(NEW.fingerprint) <> 32 THEN 'runs_fingerprint_check'
        WHEN length(NEW.idempotency_key) NOT BETWEEN 1 AND 255 THEN 'runs_idempotency_key_check'
        WHEN NEW.key_format NOT IN (1, 2, 3) THEN 'runs_key_format_check'
        WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled', 'compensated')) <> (NEW.finished_at IS NOT NULL)
            THEN 'runs_finished_consistent'
        WHEN NEW.finished_at IS NOT NULL AND NEW.lease_expires_at IS NOT NULL THEN 'runs_finished_unleased'
        WHEN (NEW.concurrency_key IS NULL) <> (NEW.concurrency_limit IS NULL) THEN 'runs_concurrency_declared'
        WHEN NEW.concurrency_limit <= 0 THEN 'runs_concurrency_limit_positive'
        WHEN NEW.holds_slot AND NEW.concurrency_key IS NULL THEN 'runs_slot_keyed'
        WHEN NEW.queue_started_at IS NOT NULL AND NEW.queue IS NULL THEN 'runs_queue_started_queued'
    END;
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "runs" violates check constraint "%"', broken
            USING ERRCODE = 'check_violation', CONSTRAINT = broken, SCHEMA = 'ratchet', TABLE = 'runs';
    END IF;
    RETURN NEW;
END $$;

-- Named to run after runs_drop_finished_slot (BEFORE triggers run in name
-- order), so that it checks the row as it will be stored.
CREATE TRIGGER runs_z_check BEFORE INSERT OR UPDATE OF
    status, fingerprint, idempotency_key, key_format, finished_at, lease_expires_at,
    concurrency_key, concurrency_limit, holds_slot, queue, queue_started_at
    ON ratchet.runs FOR EACH ROW EXECUTE FUNCTION ratchet.check_run();

ALTER TABLE ratchet.runs
    DROP CONSTRAINT runs_status_check,
    DROP CONSTRAINT runs_fingerprint_check,
    DROP CONSTRAINT runs_idempotency_key_check,
    DROP CONSTRAINT runs_key_format_check,
    DROP CONSTRAINT runs_finished_consistent,
    DROP CONSTRAINT runs_finished_unleased,
    DROP CONSTRAINT runs_concurrency_declared,
    DROP CONSTRAINT runs_concurrency_limit_positive,
    DROP CONSTRAINT runs_slot_keyed,
    DROP CONSTRAINT runs_queue_started_queued;
