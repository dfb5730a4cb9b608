package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/oklog/ulid/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// StartParams describe a request to start a workflow.
type StartParams struct {
	// Workflow is the registered workflow name.
	Workflow string
	// IdempotencyKey identifies the request within the tenant: 1..255
	// characters, no control characters.
	IdempotencyKey string
	// Input is the workflow input as JSON. Key order and whitespace do not
	// change its fingerprint.
	Input json.RawMessage
	// StartOpts are the options a start shares with the typed
	// Workflow.Start: tenant, trace, wait, concurrency, queue.
	StartOpts

	// parent is the run a StartChild phase starts this one from.
	parent string
}

// Outcome says what Start found for the idempotency key.
type Outcome int

const (
	// OutcomeCreated: the key was new; this call created the run (and, for
	// Start, executed it).
	OutcomeCreated Outcome = iota + 1
	// OutcomeFinished: the run had already finished; its stored result is
	// in Run, to be replayed.
	OutcomeFinished
	// OutcomeInProgress: a live executor holds the run's lease.
	OutcomeInProgress
	// OutcomeResumable: the run is unfinished and nobody holds a live lease
	// (its executor died, released it, or is backing off). TakeOver takes it
	// over.
	OutcomeResumable
)

func (o Outcome) String() string {
	switch o {
	case OutcomeCreated:
		return "created"
	case OutcomeFinished:
		return "finished"
	case OutcomeInProgress:
		return "in_progress"
	case OutcomeResumable:
		return "resumable"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// StartResult reports what a start found and did.
type StartResult struct {
	Outcome Outcome
	// Run is the run's state after the call: for OutcomeCreated by Start,
	// as the inline execution left it — or, when Start stopped waiting
	// first or the execution was superseded, as it was claimed; read it
	// again (Client.GetRun) for its state now.
	Run *Run
}

// Start claims the idempotency key and, if the key was new, executes the
// run in this client and waits until the execution concludes (the run
// finishes, or is released to be retried), p.Wait elapses or ctx ends.
// When the key exists Start executes nothing and reports which case holds;
// a key reused with a different workflow or input returns a
// *MismatchError.
//
// The execution does not belong to the caller: it runs on a context
// detached from ctx's cancellation (keeping its values, such as the trace),
// so a caller that stops waiting — an HTTP client that hangs up, a wait
// that elapses — leaves it running; Shutdown hands it over if it outlasts
// the process. When the wait ends first, the result holds the run as it
// was claimed (still running), with a nil error if p.Wait elapsed and
// ctx's error if ctx ended. Read the run again (Client.GetRun) for its
// state later.
//
// With Config.MaxInline executions already in progress, Start executes
// nothing: the run it creates is unleased and due at once, for a worker,
// and returned pending.
//
// An error that ends the execution itself early (lease lost, database
// unreachable, Shutdown) is returned along with the result: the run is then
// unfinished and will be resumed. A workflow's own failure is not an error
// of Start: it is in the run's Status and Error.
func (c *Client) Start(ctx context.Context, p StartParams) (*StartResult, error) {
	return c.start(ctx, nil, nil, p, true)
}

// claim claims the idempotency key as Start does, leasing a new run to
// this client, but returns before executing it.
func (c *Client) claim(ctx context.Context, p StartParams) (*StartResult, error) {
	return c.start(ctx, nil, nil, p, false)
}

// executeClaimed executes a run that claim just created for this client,
// on ctx, and returns its state as the execution left it. Once Shutdown
// has begun it executes nothing: it hands the run over at once.
func (c *Client) executeClaimed(ctx context.Context, res *StartResult) (*Run, error) {
	if res == nil || res.Outcome != OutcomeCreated || !c.holds(res.Run) {
		return nil, errors.New("engine: executeClaimed needs a run created by this client's claim")
	}
	done, draining := c.admit()
	defer done()
	if draining {
		return c.handOver(ctx, res.Run)
	}
	def, err := c.workflows.lookupVersion(res.Run.Workflow, res.Run.WorkflowVersion)
	if err != nil {
		return nil, err
	}
	return c.execute(ctx, def, res.Run, nil)
}

// executeDetached executes a run start just created, on a context of its
// own, and waits for it as Start documents. slot is called when the
// execution ends. The caller is admitted (see
// enter), so the execution's own admission cannot meet a finished
// Shutdown.
func (c *Client) executeDetached(ctx context.Context, def definition, res *StartResult, wait time.Duration, slot func()) (*StartResult, error) {
	done := c.hold()
	type outcome struct {
		run *Run
		err error
	}
	concluded := make(chan outcome, 1)
	go func() {
		defer done()
		defer slot()
		run, err := c.execute(context.WithoutCancel(ctx), def, res.Run, nil)
		concluded <- outcome{run, err}
	}()
	var timeout <-chan time.Time
	if wait < 0 {
		return res, nil
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case o := <-concluded:
		if o.run != nil {
			res.Run = o.run
		}
		return res, o.err
	case <-timeout:
		return res, nil
	case <-ctx.Done():
		return res, fmt.Errorf("engine: stopped waiting for run %s, which goes on: %w", res.Run.ID, context.Cause(ctx))
	}
}

// StartTx claims the idempotency key in the caller's transaction, so the run
// exists if and only if tx commits. It executes nothing: the created run is
// pending and unleased, for a worker (or TakeOver) to execute after commit.
func (c *Client) StartTx(ctx context.Context, tx pgx.Tx, p StartParams) (*StartResult, error) {
	if tx == nil {
		return nil, errors.New("engine: StartTx: nil transaction")
	}
	return c.start(ctx, tx, nil, p, false)
}

// start implements Start, claim (tx == nil) and StartTx. def is the typed
// caller's workflow, or nil to look p.Workflow up. A created run is executed
// when execute is set.
func (c *Client) start(ctx context.Context, tx pgx.Tx, def definition, p StartParams, execute bool) (*StartResult, error) {
	if tx == nil {
		done, err := c.enter()
		if err != nil {
			return nil, err
		}
		defer done()
	}
	if def == nil {
		// New runs start on the workflow's start version.
		registered, err := c.workflows.lookup(p.Workflow)
		if err != nil {
			return nil, err
		}
		def = registered
	} else if registered, err := c.workflows.lookupVersion(p.Workflow, def.version()); err != nil || registered != def {
		return nil, fmt.Errorf("%w: %s is registered with another definition on this client", ErrUnknownWorkflow, served(p.Workflow, def.version()))
	}
	if err := checkKey(p.IdempotencyKey); err != nil {
		return nil, err
	}
	if p.Tenant == "" {
		p.Tenant = DefaultTenant
	}
	if p.Traceparent == "" {
		p.Traceparent = traceparentOf(ctx)
	}
	input, err := canonicalJSON(p.Input)
	if err != nil {
		return nil, fmt.Errorf("%w for workflow %q: %v", ErrInvalidInput, def.Name(), err)
	}
	if err := def.checkInput(input); err != nil {
		return nil, err
	}
	ckey, climit, err := runKey(def.concurrency(), def.Name(), input, p)
	if err != nil {
		return nil, err
	}
	queue, err := c.runQueue(def, p)
	if err != nil {
		return nil, err
	}
	fp := fingerprint(def.Name(), input)

	var db dbtx = c.pool
	if tx != nil {
		db = tx
	}
	// A run Start creates is born leased to this client, to execute it at
	// once, unless MaxInline executions are in progress: then it is born
	// unleased and due, for a worker.
	lease, slot := tx == nil, func() {}
	if queue != nil {
		// Born waiting in its queue: the queue starts it.
		lease, execute = false, false
	}
	if execute && c.inline != nil {
		select {
		case c.inline <- struct{}{}:
			slot = func() { <-c.inline }
		default:
			lease, execute = false, false
		}
	}
	// A key pruned between the INSERT's conflict and the lookup is free
	// again; try once more rather than report a run that no longer exists.
	for range 3 {
		run, created, err := c.claimKey(ctx, db, def, p, input, fp, lease, runPlace{ckey, climit, queue})
		if err != nil {
			slot()
			return nil, err
		}
		if created {
			c.tel.runsStarted.Add(ctx, 1, metric.WithAttributes(attrWorkflow.String(def.Name())))
			res := &StartResult{Outcome: OutcomeCreated, Run: run}
			if queue != nil && tx == nil {
				c.ring() // (a transaction's run is not there until it commits)
			}
			if !execute {
				return res, nil
			}
			return c.executeDetached(ctx, def, res, p.Wait, slot)
		}
		slot()
		slot = func() {}
		existing, err := c.lookupKey(ctx, db, p.Tenant, p.IdempotencyKey)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, err
		}
		res, err := existingOutcome(existing, fp)
		if err == nil {
			c.tel.replays.Add(ctx, 1, metric.WithAttributes(attrWorkflow.String(def.Name()), attrOutcome.String(res.Outcome.String())))
		}
		return res, err
	}
	return nil, fmt.Errorf("engine: key %q kept disappearing while being claimed", p.IdempotencyKey)
}

func existingOutcome(lr *leasedRun, fp []byte) (*StartResult, error) {
	run := &lr.Run
	switch {
	case string(run.Fingerprint) != string(fp):
		return nil, &MismatchError{RunID: run.ID}
	case run.Status.Finished():
		return &StartResult{Outcome: OutcomeFinished, Run: run}, nil
	case lr.LeaseLive:
		return &StartResult{Outcome: OutcomeInProgress, Run: run}, nil
	default:
		return &StartResult{Outcome: OutcomeResumable, Run: run}, nil
	}
}

// claimKeySQL inserts a run unless its key exists. With $9 the run is born
// leased to the caller ($10, for $11), which is how Start claims it and
// executes it in the same breath; otherwise it is born pending and unleased.
// A run with a concurrency key ($13, limit $14) is born holding no slot:
// its execution takes one first. A run with a queue ($15, priority $16) is
// born unleased and waiting in it, until the queue starts it. $17 is the
// parent run of a child.
//
// The key's uniqueness is runs_request_unique's, over the request's digest
// (migration 0013). ON CONFLICT names no index: until the contract
// migration 0014 drops it, the previous release's (tenant,
// idempotency_key) constraint is there too, and a conflict on either is
// the key existing (naming one would make a race on the other an error).
const claimKeySQL = `
INSERT INTO ratchet.runs (id, tenant, idempotency_key, workflow, workflow_version, input, fingerprint,
	traceparent, status, lease_owner, lease_token, lease_expires_at, attempt, key_format,
	concurrency_key, concurrency_limit, queue, priority, waiting_for, parent_run_id)
SELECT $1, $2, $3, $4, $5, $6, $7, nullif($8, ''),
	CASE WHEN $9 THEN 'running' ELSE 'pending' END,
	CASE WHEN $9 THEN $10 END,
	CASE WHEN $9 THEN 1 ELSE 0 END,
	CASE WHEN $9 THEN now() + $11::interval END,
	CASE WHEN $9 THEN 1 ELSE 0 END,
	coalesce($12::smallint, (SELECT key_format FROM ratchet.settings), 1::smallint), $13, $14, $15::text, $16::integer,
	CASE WHEN $15::text IS NOT NULL THEN jsonb_build_object('kind', 'queue', 'queue', $15::text) END,
	nullif($17, '')
ON CONFLICT DO NOTHING
RETURNING ` + runColumns

// runPlace is where a new run executes: its concurrency key and limit,
// and its queue; nil for none.
type runPlace struct {
	key   *string
	limit *int
	queue *string
}

func (c *Client) claimKey(ctx context.Context, db dbtx, def definition, p StartParams, input, fp []byte, lease bool, place runPlace) (*Run, bool, error) {
	args := []any{ulid.Make().String(), p.Tenant, p.IdempotencyKey, def.Name(), def.version(), input, fp,
		p.Traceparent, lease, c.cfg.ID, c.cfg.StaleAfter, c.keyFormat(), place.key, place.limit, place.queue, p.Priority, p.parent}
	var (
		run *Run
		ok  bool
		err error
	)
	sent := time.Now() // no later than the statement's (coalesced) sending
	if db == dbtx(c.pool) {
		// Outside the caller's transaction the claim commits by itself:
		// coalesced with other executions' commits.
		run, ok, err = c.commits.queryRun(ctx, claimKeySQL, args...)
	} else {
		run, ok, err = queryRun(ctx, db, claimKeySQL, args...)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgerrcode.IsDataException(pgErr.Code) {
		// A data exception: Postgres refused a value of the input (say, a
		// number beyond numeric's range) that JSON allows.
		return nil, false, fmt.Errorf("%w for workflow %q: %s", ErrInvalidInput, def.Name(), pgErr.Message)
	}
	if err != nil {
		return nil, false, fmt.Errorf("engine: claim key: %w", err)
	}
	if ok && lease {
		run.claimSent = sent
	}
	return run, ok, nil
}

// lookupKeySQL finds a run by its request through runs_request_unique:
// the digest condition is the index's expression, the others make the
// answer exact.
const lookupKeySQL = `SELECT ` + runColumns + `, ` + leaseColumns + `
FROM ratchet.runs
WHERE ratchet.request_digest(tenant, idempotency_key) = ratchet.request_digest($1, $2)
	AND tenant = $1 AND idempotency_key = $2`

func (c *Client) lookupKey(ctx context.Context, db dbtx, tenant, key string) (*leasedRun, error) {
	rows, err := db.Query(ctx, lookupKeySQL, tenant, key)
	if err != nil {
		return nil, fmt.Errorf("engine: look up key: %w", err)
	}
	lr, err := pgx.CollectExactlyOneRow(rows, pgx.RowToAddrOfStructByName[leasedRun])
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("engine: look up key: %w", err)
	}
	return lr, err
}

// takeOverSet is what every takeover writes: a lease for owner $2 lasting
// $3, with a new token, and a new attempt. A lease that expired with its
// owner still on it was an execution lost (a crash, a lost connection):
// every clean end of an execution (park, release, retry, hand over)
// clears the owner, so this counts it as a failure.
const takeOverSet = `
	failures = failures + (lease_owner IS NOT NULL)::int,
	lease_owner = $2,
	lease_token = lease_token + 1,
	lease_expires_at = now() + $3::interval,
	attempt = attempt + 1,
	status = CASE WHEN status = 'compensating' THEN status ELSE 'running' END,
	next_attempt_at = NULL,
	updated_at = now()`

// takeOverSQL claims an unfinished run whose lease is absent or expired,
// with a new token. The row lock makes concurrent takeovers, heartbeats and
// phase commits serialise: exactly one claimant wins.
const takeOverSQL = `
UPDATE ratchet.runs SET ` + takeOverSet + `
WHERE id = $1
	AND finished_at IS NULL
	AND (lease_expires_at IS NULL OR lease_expires_at <= now())
	AND workflow || '@' || workflow_version = ANY($4)
RETURNING ` + runColumns

// TakeOver takes over an unfinished run whose lease has expired or been
// released, with a new lease token, and executes it on ctx from its
// recovery point, with the workflow version it started on: committed
// phases return their journaled output without running. A worker does
// this for every due run; call it to continue one at once. If ctx ends
// first, the run is released for another executor.
//
// A finished run is returned as it is, with nothing executed. A run leased
// by a live executor returns a *LeaseHeldError; one whose workflow version
// this client does not register returns ErrUnknownWorkflow, untouched. An
// unknown id returns ErrRunNotFound.
func (c *Client) TakeOver(ctx context.Context, runID string) (*Run, error) {
	if err := checkRunID(runID); err != nil {
		return nil, err
	}
	done, err := c.enter()
	if err != nil {
		return nil, err
	}
	defer done()
	var run *Run
	for attempt := 0; run == nil; attempt++ {
		sent := time.Now()
		claimed, ok, err := queryRun(ctx, c.pool, takeOverSQL, runID, c.cfg.ID, c.cfg.StaleAfter, c.workflows.Served())
		if err != nil {
			return nil, fmt.Errorf("engine: take over run: %w", err)
		}
		if ok {
			claimed.claimSent = sent
			run = claimed
			break
		}
		lr, err := getRun(ctx, c.pool, runID)
		switch {
		case err != nil:
			return nil, err
		case lr.Status.Finished():
			return &lr.Run, nil
		case lr.LeaseLive:
			return nil, &LeaseHeldError{RunID: runID, ExpiresAt: *lr.LeaseExpiresAt}
		case !c.serves(&lr.Run):
			return &lr.Run, fmt.Errorf("engine: take over run %s: %w: %s is not registered here", runID, ErrUnknownWorkflow, served(lr.Workflow, lr.WorkflowVersion))
		case attempt > 0:
			return nil, fmt.Errorf("engine: run %s kept changing while being taken over", runID)
		}
		// The lease expired between the two statements: try once more.
	}
	c.countTakeover(ctx, run)
	return c.continueRun(ctx, run)
}

// countTakeover records a claim that replaced an earlier lease (rather than
// the first claim of a run created unleased by StartTx), or that woke a
// parked run: a timer or a signal is not a takeover, and counts apart. (A
// woken run whose executor died before its waiting phase committed still
// carries its wait, so its takeover counts as a wake again.)
func (c *Client) countTakeover(ctx context.Context, run *Run) {
	switch {
	case run.WaitingFor != nil:
		c.tel.wakes.Add(ctx, 1, metric.WithAttributes(attrWorkflow.String(run.Workflow), attribute.String("ratchet.wait.kind", string(run.WaitingFor.Kind))))
	case run.LeaseToken > 1:
		c.tel.takeovers.Add(ctx, 1, metric.WithAttributes(attrWorkflow.String(run.Workflow)))
	}
}

// continueRun executes a run this client has just taken over, from its
// recovery point.
func (c *Client) continueRun(ctx context.Context, run *Run) (*Run, error) {
	def, err := c.workflows.lookupVersion(run.Workflow, run.WorkflowVersion)
	if err != nil {
		// Not claimable here (ClaimDue and TakeOver claim only what this
		// client serves), so only a registry changed under the client
		// lands here: release the run for a process that serves it.
		if _, rerr := c.release(ctx, run, "released a run of a workflow version this client does not serve"); rerr != nil {
			return run, fmt.Errorf("engine: resume run %s: %w (and releasing it: %v)", run.ID, err, rerr)
		}
		return run, fmt.Errorf("engine: resume run %s: %w", run.ID, err)
	}
	journal, err := listPhases(ctx, c.pool, run.ID)
	if err != nil {
		return run, err
	}
	return c.execute(ctx, def, run, journal)
}
