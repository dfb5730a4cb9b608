-- The format of a run's child keys (steps.ChildKey: 1, steps.ChildKeyV2:
-- 2), fixed when the run is created, so that its steps send the same keys
-- whichever release executes them. A run created before this migration,
-- or by a release that does not know the column, is of format 1; a client
-- configured for format 2 (engine.Config.KeyFormat) creates runs of
-- format 2.
ALTER TABLE ratchet.runs ADD COLUMN key_format smallint NOT NULL DEFAULT 1 CHECK (key_format IN (1, 2));

-- A key of format 2 names its run, and is found through the run's id; only
-- keys of format 1 need an index of every key sent. New runs of format 2
-- add nothing to it: it stops growing, and shrinks as retention prunes the
-- runs of format 1. Rebuilding it takes a few seconds per million phases
-- (3,000,000: under 9 s on two cores), during which phases cannot be
-- written.
DROP INDEX ratchet.phases_child_key_idx;
CREATE INDEX phases_child_key_idx ON ratchet.phases (child_key)
    WHERE child_key IS NOT NULL AND child_key NOT LIKE 'rk2\_%';
