-- Named queues (docs/queues.md): a run of a workflow in a queue is created
-- waiting in it, and leaves it — starts — when the queue has room: fewer
-- of its runs executing than its concurrency, fewer started in the last
-- period than its rate limit, the claiming process under its own bound.
-- Highest priority first, then creation order.
--
-- As with concurrency slots, nothing is counted beside the runs: the runs
-- executing and the starts in a period are read from the runs table each
-- time, so a process that dies frees its room as its runs finish, and no
-- count can drift.

ALTER TABLE ratchet.runs ADD COLUMN queue text;
ALTER TABLE ratchet.runs ADD COLUMN priority integer NOT NULL DEFAULT 0;
-- When the run left its queue: its start, which the rate limit counts.
-- Kept once set (a resumed run does not start again).
ALTER TABLE ratchet.runs ADD COLUMN queue_started_at timestamptz;
ALTER TABLE ratchet.runs ADD CONSTRAINT runs_queue_started_queued CHECK (queue_started_at IS NULL OR queue IS NOT NULL);

-- The waiting runs of a queue, in the order they leave it.
CREATE INDEX runs_queue_waiting_idx ON ratchet.runs (queue, priority DESC, created_at, id)
    WHERE queue IS NOT NULL AND queue_started_at IS NULL AND finished_at IS NULL;
-- The starts of a queue by time, for its rate limit and for the runs it
-- has executing (started, unfinished).
CREATE INDEX runs_queue_started_idx ON ratchet.runs (queue, queue_started_at)
    WHERE queue_started_at IS NOT NULL;

-- A queue as its processes last declared it, and until when its rate
-- limit holds its runs back: what Why and listings say of a waiting run.
-- The declaration in code is the truth; this row only reports it.
CREATE TABLE ratchet.queues (
    name          text        PRIMARY KEY,
    concurrency   integer     NOT NULL CHECK (concurrency >= 0),
    rate_limit    integer     NOT NULL CHECK (rate_limit >= 0),
    rate_period   interval    NOT NULL,
    per_process   integer     NOT NULL CHECK (per_process >= 0),
    limited_until timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- start_queued starts up to p_max runs waiting in queue p_queue, declared
-- with p_concurrency runs executing at once across every process (0: no
-- bound) and p_rate starts in any p_period (0: no bound), and leases them
-- to p_owner for p_stale, as a takeover does. It returns them in the
-- order they left the queue.
--
-- Callers for one queue are serialised by an advisory lock taken before
-- anything is counted (each statement of a function reads a fresh
-- snapshot), so two processes cannot both fill the last room. Runs locked
-- by someone else (a cancellation) are skipped for the next.
CREATE FUNCTION ratchet.start_queued(p_queue text, p_concurrency integer, p_rate integer, p_period interval,
    p_per_process integer, p_max integer, p_owner text, p_stale interval) RETURNS SETOF ratchet.runs
LANGUAGE plpgsql AS $$
DECLARE
    room integer := p_max;
    n integer;
    oldest timestamptz;
    until timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('ratchet.queue/' || p_queue, 0));
    IF p_concurrency > 0 THEN
        SELECT count(*) INTO n FROM ratchet.runs
        WHERE queue = p_queue AND queue_started_at IS NOT NULL AND finished_at IS NULL;
        room := least(room, p_concurrency - n);
    END IF;
    IF p_rate > 0 THEN
        -- The starts in the last period, oldest first: when the window is
        -- full, the oldest's leaving it is the next start's time.
        SELECT count(*), min(s) INTO n, oldest FROM (
            SELECT queue_started_at AS s FROM ratchet.runs
            WHERE queue = p_queue AND queue_started_at > now() - p_period
            ORDER BY queue_started_at
            LIMIT p_rate) w;
        room := least(room, p_rate - n);
        IF n >= p_rate THEN
            until := oldest + p_period;
        END IF;
    END IF;
    INSERT INTO ratchet.queues AS q (name, concurrency, rate_limit, rate_period, per_process, limited_until, updated_at)
    VALUES (p_queue, p_concurrency, p_rate, p_period, p_per_process, until, now())
    ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency, rate_limit = excluded.rate_limit,
        rate_period = excluded.rate_period, per_process = excluded.per_process,
        limited_until = excluded.limited_until, updated_at = excluded.updated_at
    WHERE (q.concurrency, q.rate_limit, q.rate_period, q.per_process, q.limited_until)
        IS DISTINCT FROM (excluded.concurrency, excluded.rate_limit, excluded.rate_period, excluded.per_process, excluded.limited_until);
    IF room <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH started AS (UPDATE ratchet.runs SET
        queue_started_at = now(),
        waiting_for = waiting_for->'resume',
        lease_owner = p_owner,
        lease_token = lease_token + 1,
        lease_expires_at = now() + p_stale,
        attempt = attempt + 1,
        status = CASE WHEN status = 'compensating' THEN status ELSE 'running' END,
        next_attempt_at = NULL,
        updated_at = now()
    WHERE id IN (SELECT id FROM ratchet.runs
        WHERE queue = p_queue AND queue_started_at IS NULL AND finished_at IS NULL
            AND waiting_for->>'kind' = 'queue'
        ORDER BY priority DESC, created_at, id
        LIMIT room
        FOR UPDATE SKIP LOCKED)
    RETURNING *)
    SELECT * FROM started ORDER BY priority DESC, created_at, id;
END $$;
