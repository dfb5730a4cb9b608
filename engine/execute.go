package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/ratchet-run/ratchet/internal/crashpoint"
)

type executionKey struct{}

// execution is one executor's hold on one run, from claim to conclusion. It
// travels to phase functions in the workflow's context.
type execution struct {
	c       *Client
	def     definition
	run     *Run    // as claimed: the lease token and attempt of this execution
	journal []Phase // phases committed before this execution began
	lose    context.CancelCauseFunc

	mu      sync.Mutex
	next    int             // seq of the next phase to commit or replay
	used    map[string]bool // phase names committed or replayed so far
	inPhase bool
	// fatal, once set, fails the run whatever the workflow returns.
	fatal error
	// broken, once set, ends the execution retryably: a commit's outcome is
	// unknown, so only a fresh read of the journal can say where the run is.
	broken error
	// cancelled, once set, stops the run at the next phase boundary;
	// stopped records that it did, whatever the workflow then returns.
	cancelled, stopped bool
	// deferred is a step's result committed in memory but not yet in the
	// journal (deferred.go).
	deferred *deferredStep
	// superseded records that leaseLost has reported the lease lost.
	superseded bool
	// parked, once set, is the run as a waiting phase parked it: the
	// execution is over, with nothing more to write.
	parked *Run

	// undos are the compensations registered by the phases committed or
	// replayed so far, oldest first; none once the pivot has committed.
	undos   []*compensator
	pivoted bool
	// compensating is set once the run compensates (or was resumed
	// compensating), for cause; undone holds the compensation phases
	// journaled; seqEnd is the journal's length when the execution began.
	compensating bool
	cause        *RunError
	undone       map[string]bool
	seqEnd       int

	// patches are the Patched decisions of this execution, by id.
	patches map[string]bool
	// hooks observe the execution: the client's, or none for the deploy
	// gate's replay.
	hooks Hooks
	// spent is set when the run's failures, a lost execution counted by
	// this claim the last of them, reach its retry policy's MaxAttempts:
	// the run fails with it at its first new phase.
	spent *phaseUsageError
	// failed records that this execution failed and compensates.
	failed bool
	// dry marks the deploy gate's replay, which writes nothing and runs no
	// phase; dryEnd records that it reached the end of the journal.
	dry, dryEnd bool
	// replayErr is the first journaled output the gate's replay could not
	// decode, at replaySeq.
	replayErr error
	replaySeq int
}

func executionFrom(ctx context.Context) (*execution, error) {
	ex, ok := ctx.Value(executionKey{}).(*execution)
	if !ok {
		return nil, ErrNotInRun
	}
	return ex, nil
}

// execute runs the workflow of a run this client has just claimed (the
// lease token in run is ours) and concludes it: finished, released for a
// retry, or, when ctx ends or the lease is lost, left as it stands for
// another executor. It returns the run's state as this execution left it.
func (c *Client) execute(ctx context.Context, def definition, run *Run, journal []Phase) (*Run, error) {
	if run.waitsInQueue() {
		// Claimed by a TakeOver before its queue started it: only the
		// queue starts a run.
		return c.requeue(ctx, run)
	}
	if run.needsSlot() {
		// Before anything of the run executes; a queued run's execution
		// ends here, its lease released.
		taken, err := c.takeSlot(ctx, run)
		if err != nil || !taken.HoldsSlot {
			return taken, err
		}
		run = taken
	}
	ctx, lose := context.WithCancelCause(ctx)
	defer lose(nil)
	forward, undone, cause := splitJournal(journal)
	ex := &execution{c: c, def: def, run: run, journal: forward, lose: lose, used: make(map[string]bool, len(journal)),
		// A cancellation asked of the run's previous executor is honoured
		// at this one's first new phase.
		cancelled: run.CancelRequestedAt != nil,
		pivoted:   run.Pivot != nil, compensating: run.Status == StatusCompensating, cause: cause, undone: undone, seqEnd: len(journal),
		patches: map[string]bool{}, hooks: c.hooks}
	if !ex.compensating && c.retryPolicy(def).spent(run.Failures) {
		// Only a lost execution (counted by this claim) lands here: a
		// failure that spends the last attempt finishes the run.
		ex.spent = lostExhausted(run.Failures)
	}
	ctx = context.WithValue(ctx, executionKey{}, ex)
	defer c.track(ex)()

	ctx, end := c.hooks.Run(ctx, ex.info())

	stopHeartbeat := c.heartbeat(ctx, ex)
	output, err := ex.invoke(ctx)
	if cause := c.compensationCause(ctx, ex, err); cause != nil {
		// This execution failed, unless it resumed a compensation or
		// honours a cancellation.
		ex.failed = !ex.compensating && cause.Code != CodeCancelled
		// Under the same heartbeat: undos are calls that take time.
		err = c.compensate(ctx, ex, cause)
	}
	stopHeartbeat()

	final, err := c.conclude(ctx, ex, output, err)
	ex.drop(err) // a step result no conclusion committed: the lease is lost, or the process crashed
	status := run.Status
	if final != nil {
		status = final.Status
	}
	end(RunEnd{Status: status, Err: err})
	if final == nil {
		final = run
	}
	return final, err
}

// info describes the execution as it began.
func (ex *execution) info() RunInfo {
	run := ex.run
	traceparent := ""
	if run.Traceparent != nil {
		traceparent = *run.Traceparent
	}
	return RunInfo{
		RunID: run.ID, Tenant: run.Tenant, Workflow: run.Workflow, Version: run.WorkflowVersion,
		Attempt: run.Attempt, LeaseToken: run.LeaseToken, RecoveryPoint: run.RecoveryPoint,
		Traceparent: traceparent, Resumed: run.Attempt > 1 || len(ex.journal) > 0,
	}
}

// RunInfoFrom describes the run executing in ctx — its id, tenant,
// workflow and version, attempt and lease token, and the recovery point it
// began from — for correlation and logs inside a workflow or phase. ok is
// false outside a run.
func RunInfoFrom(ctx context.Context) (info RunInfo, ok bool) {
	ex, err := executionFrom(ctx)
	if err != nil {
		return RunInfo{}, false
	}
	return ex.info(), true
}

// invoke runs the workflow function, turning a panic into a retryable error.
func (ex *execution) invoke(ctx context.Context) (out []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &panicError{value: r, stack: debug.Stack()}
		}
	}()
	return ex.def.invoke(ctx, ex.run.Input)
}

type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string { return fmt.Sprintf("workflow panicked: %v", e.value) }

// conclude records how the execution ended, fenced by its lease token.
func (c *Client) conclude(ctx context.Context, ex *execution, output []byte, err error) (*Run, error) {
	log := c.logger.With(slog.String("run_id", ex.run.ID), slog.Int64("lease_token", ex.run.LeaseToken))
	ex.mu.Lock()
	parked := ex.parked
	ex.mu.Unlock()
	if parked != nil {
		return parked, nil
	}
	if errors.Is(context.Cause(ctx), ErrLeaseLost) {
		return nil, fmt.Errorf("engine: run %s: %w", ex.run.ID, ErrLeaseLost) // leaseLost logged it
	}
	if errors.Is(context.Cause(ctx), ErrShutdown) {
		if err := ex.flush(ctx); errors.Is(err, ErrLeaseLost) {
			return nil, err
		}
		run, err := c.handOver(ctx, ex.run)
		if errors.Is(err, ErrLeaseLost) {
			return nil, ex.leaseLost(ctx)
		}
		return run, err
	}
	if cause := context.Cause(ctx); errors.Is(cause, ErrExecutionTimeout) {
		// Released like a retryable failure, so that the run is neither
		// abandoned to its lease nor retried at once.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return c.retryLater(ctx, ex, cause, &RunError{Code: CodeExecutionTimeout, Message: cause.Error(), Retryable: true})
	}
	if cause := context.Cause(ctx); errors.Is(cause, crashpoint.ErrCrashed) {
		// The test kit's crash: nothing more is written, and the lease
		// stays until it expires, as after a killed process.
		return nil, fmt.Errorf("engine: run %s: %w", ex.run.ID, cause)
	}
	if ctx.Err() != nil {
		// The caller stopped the execution (Start never does: its
		// execution is detached from the caller's context). The run is
		// released at once, as in a shutdown, rather than left leased
		// until its lease expires: another executor continues it.
		if err := ex.flush(ctx); errors.Is(err, ErrLeaseLost) {
			return nil, err
		}
		run, err := c.release(ctx, ex.run, "execution stopped by its caller: released the run for another executor")
		if errors.Is(err, ErrLeaseLost) {
			return nil, ex.leaseLost(ctx)
		}
		if err != nil {
			return nil, err
		}
		return run, fmt.Errorf("engine: run %s released: %w", ex.run.ID, context.Cause(ctx))
	}
	var pe *panicError
	if errors.As(err, &pe) {
		log.ErrorContext(ctx, "workflow panicked", slog.Any("panic", pe.value), slog.String("stack", string(pe.stack)))
	}

	ex.mu.Lock()
	fatal, broken, stopped, compensating := ex.fatal, ex.broken, ex.stopped, ex.compensating
	if fatal == nil && broken == nil && err == nil && ex.next < len(ex.journal) && !compensating {
		fatal = &NonDeterminismError{Seq: ex.next, Journaled: ex.journal[ex.next].Name}
	}
	ex.mu.Unlock()

	switch {
	case compensating && err == nil && broken == nil:
		return c.finish(ctx, ex, StatusCompensated, ex.compensationRecord(), ex.cause)
	case compensating:
		// An undo failed retryably (or a commit's outcome is unknown):
		// compensations are retried until they succeed.
		return c.retryLater(ctx, ex, cmp.Or(broken, err), c.runError(cmp.Or(broken, err)))
	case stopped:
		return c.finish(ctx, ex, StatusCancelled, nil, cancelledError)
	case fatal != nil:
		return c.finish(ctx, ex, StatusFailed, nil, classify(fatal))
	case broken != nil:
		return c.retryLater(ctx, ex, broken, c.runError(broken))
	case err == nil:
		return c.finish(ctx, ex, StatusSucceeded, output, nil)
	}
	runErr := c.runError(err)
	if !runErr.Retryable {
		return c.finish(ctx, ex, StatusFailed, nil, runErr)
	}
	return c.retryLater(ctx, ex, err, runErr)
}

// releasedStatus is the status of a run released by its executor: pending,
// unless it is compensating (which it stays until it finishes).
const releasedStatus = `CASE WHEN status = 'compensating' THEN status ELSE 'pending' END`

// finishSQL ends a run: status, output or error, expiry, and the lease
// released, in one fenced statement.
const finishSQL = `
UPDATE ratchet.runs SET ` + finishColumns + `
WHERE id = $1 AND lease_token = $2 AND finished_at IS NULL
RETURNING ` + runColumns

// finishColumns are what a finish sets; $8 is the run's failures, this
// execution's counted (finishArgs).
const finishColumns = `
	status = $3,
	failures = $8,
	output = $4,
	error = $5,
	finished_at = now(),
	expires_at = now() + $6::interval,
	response_status = $7,
	lease_owner = NULL,
	lease_expires_at = NULL,
	next_attempt_at = NULL,
	updated_at = now()`

// finish ends the run with status. A step result the execution holds is
// journaled by the same statement (finishWithPhaseSQL).
func (c *Client) finish(ctx context.Context, ex *execution, status Status, output []byte, runErr *RunError) (*Run, error) {
	d := ex.takeDeferred()
	sql, args, err := ex.finishArgs(d, status, output, runErr)
	var run *Run
	if err == nil {
		var ok bool
		run, ok, err = c.commits.queryRun(ctx, sql, args...)
		switch {
		case err != nil:
			err = fmt.Errorf("engine: finish run %s: %w", ex.run.ID, err)
		case !ok:
			err = ex.leaseLost(ctx)
		}
	}
	if d != nil {
		var stepErr error
		if err != nil {
			stepErr = fmt.Errorf("engine: phase %q: commit journal with the run's finish: %w", d.rec.name, err)
		}
		ex.settle(d, false, stepErr) //nolint:errcheck // err is returned below
	}
	if err != nil {
		return nil, err
	}
	c.tel.runsFinished.Add(ctx, 1, metric.WithAttributes(attrWorkflow.String(run.Workflow), attrStatus.String(string(status))))
	ex.gaveUpSlot()
	return run, nil
}

// retrySQL releases a run after a retryable failure, to be executed again
// from its recovery point no earlier than the backoff allows (the run is
// due at next_attempt_at). Like a hand over, the release takes a new token,
// so that a zombie of the released lease is fenced.
const retrySQL = `
UPDATE ratchet.runs SET
	lease_token = lease_token + 1,
	status = ` + releasedStatus + `,
	-- The same error: the same code, and the same message but for its
	-- numbers (attempts, durations).
	error_streak = CASE WHEN error->>'code' = $3::jsonb->>'code'
			AND regexp_replace(error->>'message', '[0-9.]+', '', 'g') = regexp_replace($3::jsonb->>'message', '[0-9.]+', '', 'g')
		THEN error_streak + 1 ELSE 1 END,
	error = $3,
	failures = failures + 1,
	next_attempt_at = now() + $4::interval,
	lease_owner = NULL,
	lease_expires_at = NULL,
	updated_at = now()
WHERE id = $1 AND lease_token = $2 AND finished_at IS NULL
RETURNING ` + runColumns

// retryDecision is the backoff the run's retry policy gives for cause, and
// whether the policy gives up instead. A compensating run's policy never
// gives up: compensations are retried until they succeed.
func (c *Client) retryDecision(ex *execution, cause error) (backoff time.Duration, givesUp bool) {
	policy := c.retryPolicy(ex.def)
	// This failure is the run's Failures+1-th: wakes and re-queues are
	// executions too (Attempt), but neither grows the backoff nor spends
	// a retry.
	failed := ex.run.Failures + 1
	backoff = policy.delay(failed, cause)
	return backoff, !ex.compensating && policy.givesUp(failed, ex.run.CreatedAt, backoff)
}

// retryPolicy is the workflow's retry policy, or else the client's.
func (c *Client) retryPolicy(def definition) RetryPolicy {
	if p := def.retryPolicy(); p != nil {
		return *p
	}
	return c.cfg.Retry
}

// retryLater releases the run to be executed again after the backoff its
// retry policy gives for cause, or fails it if the policy gives up.
func (c *Client) retryLater(ctx context.Context, ex *execution, cause error, runErr *RunError) (*Run, error) {
	backoff, givesUp := c.retryDecision(ex, cause)
	if givesUp {
		c.logger.WarnContext(ctx, "run failed retryably and its retry policy gives up",
			slog.String("run_id", ex.run.ID), slog.Int("attempt", ex.run.Attempt), slog.Int("failures", ex.run.Failures+1),
			slog.String("error", runErr.Message))
		return c.finish(ctx, ex, StatusFailed, nil, exhausted(ex.run.Failures+1, runErr))
	}
	// The step result the execution holds is kept: the call happened.
	if err := ex.flush(ctx); errors.Is(err, ErrLeaseLost) {
		return nil, err
	}
	run, ok, err := queryRun(ctx, c.pool, retrySQL, ex.run.ID, ex.run.LeaseToken, runErr, backoff)
	if err != nil {
		return nil, fmt.Errorf("engine: release run %s for retry: %w", ex.run.ID, err)
	}
	if !ok {
		return nil, ex.leaseLost(ctx)
	}
	level := slog.LevelInfo
	if runErr.Code == CodePhaseIdleTimeout || runErr.Code == CodeUndefinedTable {
		level = slog.LevelWarn // a misconfiguration: retrying alone will not mend it
	}
	c.logger.Log(ctx, level, "run failed retryably; will retry",
		slog.String("run_id", ex.run.ID), slog.Int("attempt", ex.run.Attempt), slog.Int("failures", ex.run.Failures+1),
		slog.Duration("backoff", backoff), slog.String("error", runErr.Message))
	return run, nil
}

// leaseLost records that a fenced write found another token, cancels the
// execution and returns the error to report. The first report of an
// execution is logged and counted; a heartbeat and a commit that both find
// the lease gone are one supersession.
func (ex *execution) leaseLost(ctx context.Context) error {
	ex.mu.Lock()
	first := !ex.superseded
	ex.superseded = true
	ex.mu.Unlock()
	ex.lose(ErrLeaseLost)
	if first {
		ex.c.tel.fencing.Add(ctx, 1, metric.WithAttributes(attrWorkflow.String(ex.run.Workflow)))
		ex.c.logger.WarnContext(ctx, "execution superseded: another executor took over the run",
			slog.String("run_id", ex.run.ID), slog.Int64("lease_token", ex.run.LeaseToken))
	}
	return fmt.Errorf("engine: run %s: %w", ex.run.ID, ErrLeaseLost)
}

const heartbeatSQL = `
UPDATE ratchet.runs SET lease_expires_at = now() + $3::interval
WHERE id = $1 AND lease_token = $2 AND finished_at IS NULL`

// heartbeat extends the lease every HeartbeatInterval until the returned
// stop function is called (which waits for the goroutine to exit). A
// heartbeat that finds the token changed cancels the execution.
//
// The lease is good until at least StaleAfter after the claim or the last
// good heartbeat was sent, by this process's clock (the database counts
// from its now(), which is later). The execution stops one interval before
// that bound, whatever the database's clock says, as one superseded does,
// rather than call downstream while another executor may too: a timer
// marks the moment, and no heartbeat statement is left to run past it. A
// claim already that old (one that waited long between ClaimDue and
// Continue, or behind a slow journal read) stops the execution before its
// first phase.
func (c *Client) heartbeat(ctx context.Context, ex *execution) (stop func()) {
	margin := c.cfg.StaleAfter - c.cfg.HeartbeatInterval
	confirmed := ex.run.claimSent
	expire := func() {
		unconfirmed := time.Since(confirmed)
		c.logger.WarnContext(ctx, "no claim or heartbeat confirmed the lease for most of it: stopping before it may expire",
			slog.String("run_id", ex.run.ID), slog.Duration("unconfirmed", unconfirmed))
		ex.lose(fmt.Errorf("%w: nothing confirmed the lease for %s", ErrLeaseLost, unconfirmed.Round(time.Millisecond)))
	}
	if time.Since(confirmed) >= margin {
		expire()
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(c.cfg.HeartbeatInterval)
		defer ticker.Stop()
		deadline := time.NewTimer(time.Until(confirmed.Add(margin)))
		defer deadline.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-deadline.C:
				expire()
				return
			case <-ticker.C:
			}
			sent := time.Now()
			limit := confirmed.Add(margin)
			if !sent.Before(limit) {
				expire()
				return
			}
			hctx, hcancel := context.WithTimeout(ctx, min(c.cfg.HeartbeatInterval, limit.Sub(sent)))
			tag, err := c.pool.Exec(hctx, heartbeatSQL, ex.run.ID, ex.run.LeaseToken, c.cfg.StaleAfter)
			hcancel()
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				c.logger.WarnContext(ctx, "heartbeat failed; lease may expire",
					slog.String("run_id", ex.run.ID), slog.String("error", err.Error()))
			case tag.RowsAffected() == 0:
				ex.leaseLost(ctx) //nolint:errcheck // the cancellation is the report
				return
			default:
				confirmed = sent
				deadline.Reset(time.Until(confirmed.Add(margin)))
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
