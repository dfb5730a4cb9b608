-- Durable schedules (docs/schedules.md): each tick of a schedule starts
-- exactly one run, whose idempotency key names the schedule and the tick,
-- whichever process ticks it. A process ticks a schedule by locking its
-- row, starting the runs of its due ticks and moving next_tick_at past
-- them, all in one transaction: another process skips the locked row, and
-- a process that dies mid-tick leaves the row as it was, for the next.

CREATE TABLE ratchet.schedules (
    tenant        text        NOT NULL,
    name          text        NOT NULL,
    -- A cron expression in time_zone, or a fixed interval: one of them.
    cron          text,
    every         interval,
    time_zone     text        NOT NULL DEFAULT '',
    workflow      text        NOT NULL,
    input         jsonb       NOT NULL,
    catch_up      text        NOT NULL CHECK (catch_up IN ('skip', 'one', 'all')),
    overlap       text        NOT NULL CHECK (overlap IN ('skip', 'buffer', 'allow')),
    -- Who declared it last: a process's code, or the API.
    source        text        NOT NULL CHECK (source IN ('code', 'api')),
    paused        boolean     NOT NULL DEFAULT false,
    next_tick_at  timestamptz NOT NULL,
    last_tick_at  timestamptz,
    last_run_id   text,
    started       bigint      NOT NULL DEFAULT 0,
    skipped       bigint      NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name),
    CONSTRAINT schedules_one_timing CHECK ((cron IS NULL) <> (every IS NULL))
);

-- What every worker polls: the schedules due.
CREATE INDEX schedules_due_idx ON ratchet.schedules (next_tick_at) WHERE NOT paused;
