-- Signals: the inbox of events runs wait for (a bank's webhook, a
-- customer's 3-D Secure answer). A signal is addressed to a run (run_id)
-- or by a correlation key the awaiting workflow declares (a transfer id
-- the bank echoes), and is idempotent by its own key: the provider's event
-- id, unique within the tenant. It is kept until a run's Await consumes it
-- (in the fenced commit of that phase; it then goes when that run is
-- pruned) or, unconsumed, until expires_at.
CREATE TABLE ratchet.signals (
    id              bigserial   PRIMARY KEY,
    tenant          text        NOT NULL,
    name            text        NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    event_id        text        NOT NULL CHECK (length(event_id) BETWEEN 1 AND 255),
    run_id          text        REFERENCES ratchet.runs ON DELETE CASCADE,
    correlation_key text        CHECK (length(correlation_key) BETWEEN 1 AND 255),
    payload         jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    -- The run the signal woke when it arrived, if it woke one: a
    -- redelivery is answered with it.
    delivered_to    text,
    consumed_by     text        REFERENCES ratchet.runs ON DELETE CASCADE,
    consumed_at     timestamptz,
    CONSTRAINT signals_addressed CHECK ((run_id IS NULL) <> (correlation_key IS NULL)),
    CONSTRAINT signals_event_unique UNIQUE (tenant, event_id)
);

-- What an Await looks for, unconsumed: by run, or by correlation key.
CREATE INDEX signals_by_run_idx ON ratchet.signals (run_id, name, id)
    WHERE consumed_at IS NULL AND run_id IS NOT NULL;
CREATE INDEX signals_by_correlation_idx ON ratchet.signals (tenant, name, correlation_key, id)
    WHERE consumed_at IS NULL AND correlation_key IS NOT NULL;
-- A pruned run takes the signals sent to it, or consumed by it, along.
CREATE INDEX signals_run_idx ON ratchet.signals (run_id) WHERE run_id IS NOT NULL;
CREATE INDEX signals_consumer_idx ON ratchet.signals (consumed_by) WHERE consumed_by IS NOT NULL;
-- What pruning deletes.
CREATE INDEX signals_expiry_idx ON ratchet.signals (expires_at) WHERE consumed_at IS NULL;

-- A run waiting for a signal with no timeout is due only when a signal
-- arrives (which sets next_attempt_at to now()): due_at is recomputed so
-- that a waiting run without a wake time is never due.
DROP INDEX ratchet.runs_due_idx;
ALTER TABLE ratchet.runs DROP COLUMN due_at;
ALTER TABLE ratchet.runs ADD COLUMN due_at timestamptz GENERATED ALWAYS AS (
    CASE WHEN finished_at IS NULL AND NOT (status = 'waiting' AND next_attempt_at IS NULL)
        THEN coalesce(greatest(lease_expires_at, next_attempt_at), updated_at)
    END) STORED;
CREATE INDEX runs_due_idx ON ratchet.runs (due_at) WHERE due_at IS NOT NULL;

-- Which waiting run awaits a signal sent by correlation key.
CREATE INDEX runs_awaiting_idx ON ratchet.runs (tenant, (waiting_for->>'signal'), (waiting_for->>'correlation_key'))
    WHERE status = 'waiting';
