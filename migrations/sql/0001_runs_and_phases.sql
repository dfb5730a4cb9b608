-- Runs: one row per (tenant, idempotency key). Phases: the checkpoint journal.
-- docs/engine.md explains the protocol these columns serve.

CREATE TABLE ratchet.runs (
    id                text        PRIMARY KEY,
    tenant            text        NOT NULL,
    idempotency_key   text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    workflow          text        NOT NULL,
    workflow_version  integer     NOT NULL,
    input             jsonb       NOT NULL,
    fingerprint       bytea       NOT NULL CHECK (length(fingerprint) = 32),
    status            text        NOT NULL DEFAULT 'pending'
                                  CHECK (status IN ('pending', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')),
    recovery_point    text        NOT NULL DEFAULT 'started',
    lease_owner       text,
    lease_token       bigint      NOT NULL DEFAULT 0,
    lease_expires_at  timestamptz,
    attempt           integer     NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz,
    output            jsonb,
    error             jsonb,
    response_status   integer,
    traceparent       text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    expires_at        timestamptz,

    CONSTRAINT runs_tenant_key_unique UNIQUE (tenant, idempotency_key),
    -- A finished run holds no lease, and only a finished run has finished_at.
    CONSTRAINT runs_finished_consistent CHECK (
        (status IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL)
    ),
    CONSTRAINT runs_finished_unleased CHECK (
        finished_at IS NULL OR lease_expires_at IS NULL
    )
);

-- Recovery looks for unfinished runs by lease expiry or backoff.
CREATE INDEX runs_unfinished_idx ON ratchet.runs (lease_expires_at, next_attempt_at)
    WHERE finished_at IS NULL;

-- Retention prunes finished runs past expires_at.
CREATE INDEX runs_expires_at_idx ON ratchet.runs (expires_at)
    WHERE expires_at IS NOT NULL;

CREATE TABLE ratchet.phases (
    run_id       text        NOT NULL REFERENCES ratchet.runs (id) ON DELETE CASCADE,
    seq          integer     NOT NULL CHECK (seq >= 0),
    name         text        NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    kind         text        NOT NULL CHECK (kind IN ('atomic', 'step', 'sleep', 'signal')),
    output       jsonb,
    child_key    text,
    attempts     integer     NOT NULL DEFAULT 1 CHECK (attempts >= 1),
    error        jsonb,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL,

    PRIMARY KEY (run_id, seq),
    CONSTRAINT phases_run_name_unique UNIQUE (run_id, name)
);

-- "Which run issued downstream key X?"
CREATE INDEX phases_child_key_idx ON ratchet.phases (child_key) WHERE child_key IS NOT NULL;
