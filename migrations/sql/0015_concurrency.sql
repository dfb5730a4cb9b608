-- Per-key concurrency (docs/concurrency.md): a run of a workflow that
-- declares a concurrency key executes only while it holds one of its key's
-- slots, and at most concurrency_limit runs of a key hold one.
--
-- A slot is not a counter kept beside the runs: it is a flag of the run
-- that holds it, in the same row as its status, so that it is given up in
-- the very statement that finishes or parks the run, whichever statement
-- that is (the trigger below sees to finishes), and a run that died with
-- its executor keeps it only until it is resumed and finishes. Nothing can
-- drift: the slots held are counted from the runs table each time.

-- The key, with its group ("refunds/cus_123"), and the limit of the
-- workflow that started the run, fixed at its creation.
ALTER TABLE ratchet.runs ADD COLUMN concurrency_key text;
ALTER TABLE ratchet.runs ADD COLUMN concurrency_limit integer;
-- Set when the run takes a slot (ratchet.take_slot), cleared when it
-- finishes, or parks releasing its slot.
ALTER TABLE ratchet.runs ADD COLUMN holds_slot boolean NOT NULL DEFAULT false;

ALTER TABLE ratchet.runs ADD CONSTRAINT runs_concurrency_declared CHECK (
    (concurrency_key IS NULL) = (concurrency_limit IS NULL));
ALTER TABLE ratchet.runs ADD CONSTRAINT runs_concurrency_limit_positive CHECK (concurrency_limit > 0);
ALTER TABLE ratchet.runs ADD CONSTRAINT runs_slot_keyed CHECK (NOT holds_slot OR concurrency_key IS NOT NULL);

-- A run waiting for a slot is queued: parked for it, unleased, with
-- waiting_for {"kind": "concurrency", "key": …, "resume": what it waited
-- for before, if anything} and no next_attempt_at, so that it is not due
-- and no poll claims it, until a slot passes to it (its earlier wait
-- restored, next_attempt_at = now()).
--
-- The unfinished runs of each key in creation order: the slots held, who
-- is ahead of a run, and which queued run is next.
CREATE INDEX runs_concurrency_idx ON ratchet.runs (tenant, concurrency_key, created_at, id)
    WHERE concurrency_key IS NOT NULL AND finished_at IS NULL;

-- A run finishes holding no slot, whichever statement finishes it.
CREATE FUNCTION ratchet.drop_finished_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.holds_slot := false;
    RETURN NEW;
END $$;
CREATE TRIGGER runs_drop_finished_slot BEFORE UPDATE ON ratchet.runs FOR EACH ROW
    WHEN (NEW.holds_slot AND NEW.finished_at IS NOT NULL)
    EXECUTE FUNCTION ratchet.drop_finished_slot();

-- A slot given up passes to the key's oldest queued run, in the
-- transaction that gives it up: it becomes due, and takes the slot when an
-- executor claims it. A queued run another slot is passing to at this
-- moment (its row locked) is skipped for the next.
--
-- No wake is lost to a run queueing concurrently: take_slot counts the
-- holders FOR SHARE, so it waits for this transaction, and then sees its
-- slot free rather than queue behind it.
CREATE FUNCTION ratchet.pass_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ratchet.runs SET waiting_for = waiting_for->'resume', next_attempt_at = now(), updated_at = now()
    WHERE id = (SELECT id FROM ratchet.runs
        WHERE tenant = OLD.tenant AND concurrency_key = OLD.concurrency_key
            AND finished_at IS NULL AND NOT holds_slot AND waiting_for->>'kind' = 'concurrency'
        ORDER BY created_at, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED);
    RETURN NULL;
END $$;
CREATE TRIGGER runs_pass_slot AFTER UPDATE ON ratchet.runs FOR EACH ROW
    WHEN (OLD.holds_slot AND NOT NEW.holds_slot)
    EXECUTE FUNCTION ratchet.pass_slot();

-- take_slot is the only way a run gets a slot: called by the executor that
-- claimed it (lease token p_token) before anything of the run executes. It
-- returns the run: holding a slot, or queued with its lease released (a
-- new token fences the caller, whose execution ends there), or no row
-- when the token is not the run's.
--
-- A run takes a slot when the slots held and the runs of its key ahead of
-- it (older, without a slot, not parked — parked for anything but a slot:
-- a run that released its slot to sleep, or to wait for an operator, is
-- not ahead of anyone) are fewer than its limit: runs of
-- a key start in creation order. Callers for one key are serialised by an
-- advisory lock, taken before the counts are read (each statement of a
-- function reads a fresh snapshot), so two cannot both see the last slot
-- free. A queuing run that finds slots free with only queued runs ahead
-- (a pass was skipped, or the limit was raised) passes them on itself.
CREATE FUNCTION ratchet.take_slot(p_id text, p_token bigint) RETURNS SETOF ratchet.runs
LANGUAGE plpgsql AS $$
DECLARE
    r ratchet.runs;
    held integer;
    ahead integer;
    awake integer;
BEGIN
    SELECT * INTO r FROM ratchet.runs WHERE id = p_id AND lease_token = p_token AND finished_at IS NULL;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF r.concurrency_key IS NULL OR r.holds_slot THEN
        RETURN NEXT r;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('ratchet.slot/' || r.tenant || '/' || r.concurrency_key, 0));
    SELECT count(*) INTO held FROM (
        SELECT 1 FROM ratchet.runs
        WHERE tenant = r.tenant AND concurrency_key = r.concurrency_key AND finished_at IS NULL AND holds_slot
        FOR SHARE) holders;
    SELECT count(*), count(*) FILTER (WHERE waiting_for->>'kind' IS DISTINCT FROM 'concurrency') INTO ahead, awake
    FROM ratchet.runs
    WHERE tenant = r.tenant AND concurrency_key = r.concurrency_key AND finished_at IS NULL
        AND NOT holds_slot AND (waiting_for IS NULL OR waiting_for->>'kind' = 'concurrency')
        AND (created_at, id) < (r.created_at, r.id);
    IF held + ahead < r.concurrency_limit THEN
        UPDATE ratchet.runs SET holds_slot = true,
            waiting_for = CASE WHEN waiting_for->>'kind' = 'concurrency' THEN waiting_for->'resume' ELSE waiting_for END
        WHERE id = p_id
        RETURNING * INTO r;
        RETURN NEXT r;
        RETURN;
    END IF;
    IF held + awake < r.concurrency_limit THEN
        UPDATE ratchet.runs SET waiting_for = waiting_for->'resume', next_attempt_at = now(), updated_at = now()
        WHERE id IN (SELECT id FROM ratchet.runs
            WHERE tenant = r.tenant AND concurrency_key = r.concurrency_key AND finished_at IS NULL
                AND NOT holds_slot AND waiting_for->>'kind' = 'concurrency' AND (created_at, id) < (r.created_at, r.id)
            ORDER BY created_at, id
            LIMIT r.concurrency_limit - held - awake
            FOR UPDATE SKIP LOCKED);
    END IF;
    UPDATE ratchet.runs SET
        status = CASE WHEN status = 'compensating' THEN status ELSE 'pending' END,
        waiting_for = CASE WHEN waiting_for->>'kind' = 'concurrency' THEN waiting_for
            ELSE jsonb_strip_nulls(jsonb_build_object('kind', 'concurrency', 'key', concurrency_key, 'resume', waiting_for)) END,
        next_attempt_at = NULL,
        lease_token = lease_token + 1,
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = now()
    WHERE id = p_id
    RETURNING * INTO r;
    RETURN NEXT r;
END $$;

-- pass_free_slots passes every key's free slots to its oldest queued runs:
-- workers call it now and then, for slots no pass reached (the limit was
-- raised; a run a slot passed to was cancelled before it took it). It
-- returns how many runs it woke.
CREATE FUNCTION ratchet.pass_free_slots() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    k record;
    woken integer := 0;
    n integer;
BEGIN
    FOR k IN
        SELECT tenant, concurrency_key,
            max(concurrency_limit) FILTER (WHERE waiting_for->>'kind' = 'concurrency') AS lim,
            count(*) FILTER (WHERE holds_slot) AS held,
            count(*) FILTER (WHERE NOT holds_slot AND waiting_for IS NULL) AS awake
        FROM ratchet.runs
        WHERE concurrency_key IS NOT NULL AND finished_at IS NULL
        GROUP BY tenant, concurrency_key
        HAVING count(*) FILTER (WHERE NOT holds_slot AND waiting_for->>'kind' = 'concurrency') > 0
    LOOP
        CONTINUE WHEN k.held + k.awake >= k.lim;
        UPDATE ratchet.runs SET waiting_for = waiting_for->'resume', next_attempt_at = now(), updated_at = now()
        WHERE id IN (SELECT id FROM ratchet.runs
            WHERE tenant = k.tenant AND concurrency_key = k.concurrency_key AND finished_at IS NULL
                AND NOT holds_slot AND waiting_for->>'kind' = 'concurrency'
            ORDER BY created_at, id
            LIMIT k.lim - k.held - k.awake
            FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS n = ROW_COUNT;
        woken := woken + n;
    END LOOP;
    RETURN woken;
END $$;
