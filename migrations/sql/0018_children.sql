-- Child workflows (docs/children.md): a phase of a run starts another run,
-- its child, keyed by the parent's run and the phase, and a later phase
-- awaits it, the parent parked meanwhile.

-- The run a child was started by; NULL for a run started otherwise.
ALTER TABLE ratchet.runs ADD COLUMN parent_run_id text;
CREATE INDEX runs_parent_idx ON ratchet.runs (parent_run_id, created_at) WHERE parent_run_id IS NOT NULL;

ALTER TABLE ratchet.phases DROP CONSTRAINT phases_kind_check;
ALTER TABLE ratchet.phases ADD CONSTRAINT phases_kind_check CHECK (kind IN
    ('atomic', 'step', 'sleep', 'signal', 'compensation', 'patch', 'start_child', 'await_child'));

-- A child that finishes wakes its parent if the parent is parked awaiting
-- it, in the statement that finishes it. No wake is lost to a parent
-- parking concurrently: the await reads the child FOR SHARE before it
-- parks, so it either waits for this statement's transaction and sees the
-- child finished, or parks first and is woken here.
CREATE FUNCTION ratchet.wake_parent() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ratchet.runs SET next_attempt_at = now(), updated_at = now()
    WHERE id = NEW.parent_run_id AND finished_at IS NULL AND lease_expires_at IS NULL
        AND waiting_for->>'kind' = 'await_child' AND waiting_for->>'child' = NEW.id;
    RETURN NULL;
END $$;
CREATE TRIGGER runs_wake_parent AFTER UPDATE ON ratchet.runs FOR EACH ROW
    WHEN (NEW.parent_run_id IS NOT NULL AND OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL)
    EXECUTE FUNCTION ratchet.wake_parent();
