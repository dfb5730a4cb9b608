-- Versions side by side (docs/versioning.md).
--
-- Live processes say which workflow versions they serve, so that "who can
-- run this?" has an answer: a process that polls for due runs upserts its
-- row every few seconds with an expiry, and deletes it when it stops. A
-- row past expires_at is a process that died.
CREATE TABLE ratchet.processes (
    id           text        PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 255),
    serves       text[]      NOT NULL, -- "workflow@version"
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);

-- Patched(ctx, id) journals a marker phase of kind 'patch' when a run
-- first takes a patched path, so that its replays take it again and runs
-- journaled before the patch keep the old one.
ALTER TABLE ratchet.phases DROP CONSTRAINT phases_kind_check;
ALTER TABLE ratchet.phases ADD CONSTRAINT phases_kind_check CHECK (kind IN
    ('atomic', 'step', 'sleep', 'signal', 'compensation', 'patch'));
