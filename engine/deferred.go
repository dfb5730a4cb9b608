package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Deferred step results.
//
// A run is a chain of commits, none of which may begin before the one
// before it is durable: that is what a recovery point is. A step's result
// need not be durable when Step returns, only before anything outside the
// process can see it: before the run's next call downstream, its next wait,
// its finish. So a step's successful result is held by the execution and
// written by the next statement that commits anyway — inside the next
// atomic phase's transaction, or with the run's finish — and, before any
// other phase, by itself. A run of K steps is then K+1 commits, not K+2
// (docs/performance.md).
//
// What holds, as before: nothing the workflow does with the result is seen
// downstream before it commits (the next step's call waits for it; an
// atomic phase's writes commit with it); a crash before it commits repeats
// the call with the same child key, as a crash between the call and its
// commit always did; the step's hook (its span) ends when the result is
// durable, or with the error that kept it from being, and that error names
// the step. Config.CommitStepsAlone restores a commit per step.

// deferredStep is a step's result committed in memory (the execution has
// moved past it) but not yet in the journal.
type deferredStep struct {
	rec phaseRecord
	// end is the step's phase hook, called once the result is durable or
	// cannot become so.
	end func(error)
}

// deferStep holds rec as the execution's pending step result. The phase is
// committed in memory: the next phase takes the next position.
func (ex *execution) deferStep(rec phaseRecord) {
	ex.mu.Lock()
	ex.deferred = &deferredStep{rec: rec}
	ex.mu.Unlock()
	ex.committed(rec.name, false)
}

// holdEnd gives the pending result of the phase at seq its hook's end, and
// reports whether there was one: the phase's end then waits for its commit.
func (ex *execution) holdEnd(seq int, end func(error)) bool {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.deferred == nil || ex.deferred.rec.seq != seq {
		return false
	}
	ex.deferred.end = end
	return true
}

// takeDeferred removes and returns the pending result, if any.
func (ex *execution) takeDeferred() *deferredStep {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	d := ex.deferred
	ex.deferred = nil
	return d
}

// flush commits the pending result by itself, if there is one. It commits
// even when ctx has ended (the call has happened), within
// stepCommitTimeout.
func (ex *execution) flush(ctx context.Context) error {
	d := ex.takeDeferred()
	if d == nil {
		return nil
	}
	commitCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stepCommitTimeout)
	defer cancel()
	cancelled, err := ex.commitPhase(commitCtx, nil, d.rec)
	return ex.settle(d, cancelled, err)
}

// settle records the outcome of d's commit: a cancellation it found
// pending, and its hook's end.
func (ex *execution) settle(d *deferredStep, cancelled bool, err error) error {
	if err == nil && cancelled {
		ex.mu.Lock()
		ex.cancelled = true
		ex.mu.Unlock()
	}
	if d.end != nil {
		d.end(err)
	}
	return err
}

// drop ends the pending result's hook with why, when the execution ends
// without committing it (its lease lost, its process crashed): the next
// executor calls the step again, with the same key.
func (ex *execution) drop(why error) {
	if d := ex.takeDeferred(); d != nil && d.end != nil {
		d.end(cmp.Or(why, errors.New("engine: execution ended before the step's result was committed")))
	}
}

// carry writes the pending result in tx, an atomic phase's transaction,
// after the phase's own work and before its journal row. It returns the
// result to settle once tx commits (nil when none was pending). When the
// run has a cancellation pending, the atomic phase's commit would be
// refused and roll the result back with it: then tx is rolled back, the
// result held again (the run's conclusion commits it: its finish as
// cancelled, or its compensation) and ErrCancelled returned.
func (ex *execution) carry(ctx context.Context, tx pgx.Tx) (*deferredStep, error) {
	d := ex.takeDeferred()
	if d == nil {
		return nil, nil
	}
	cancelled, err := ex.commitPhase(ctx, tx, d.rec)
	if err != nil {
		return nil, ex.settle(d, false, err)
	}
	if !cancelled {
		return d, nil
	}
	tx.Rollback(ctx) //nolint:errcheck // the phase is refused either way
	ex.mu.Lock()
	ex.deferred = d // committed by the run's conclusion
	ex.cancelled, ex.stopped = true, true
	ex.mu.Unlock()
	return nil, ErrCancelled
}

// finishWithPhaseSQL is finishSQL that also journals the pending step
// result ($9 on: phaseCommit's arguments) and moves the recovery point to
// it, in the same fenced statement: the run's last step and its end are
// one commit.
const finishWithPhaseSQL = `
WITH finished AS (
	UPDATE ratchet.runs SET recovery_point = $9, waiting_for = NULL, ` + finishColumns + `
	WHERE id = $1 AND lease_token = $2 AND finished_at IS NULL
	RETURNING ` + runColumns + `
), journaled AS (
	INSERT INTO ratchet.phases (run_id, seq, name, kind, output, child_key, attempts, error, started_at, finished_at, compensable, execution)
	SELECT id, $10, $9, $11, $12, $13, $14, $15, coalesce($16, now()), clock_timestamp(), $17, attempt FROM finished
)
SELECT * FROM finished`

// finishArgs are the arguments of finishSQL, followed, when d is not nil,
// by those of its journal row for finishWithPhaseSQL.
func (ex *execution) finishArgs(d *deferredStep, status Status, output []byte, runErr *RunError) (sql string, args []any, err error) {
	failures := ex.run.Failures
	if (status == StatusFailed || ex.failed) && ex.spent == nil {
		// This execution failed (a lost one that spent the run's
		// attempts was counted by the claim that followed it).
		failures++
	}
	args = []any{ex.run.ID, ex.run.LeaseToken, status, output, runErr, ex.def.ttl(status), ex.def.responseStatus(status, runErr), failures}
	if d == nil {
		return finishSQL, args, nil
	}
	pc, err := ex.phaseCommit(d.rec)
	if err != nil {
		return "", nil, fmt.Errorf("engine: phase %q: %w", d.rec.name, err)
	}
	return finishWithPhaseSQL, append(args, pc.name, pc.seq, string(pc.kind), pc.output, pc.childKey, pc.attempts, pc.errJSON, pc.startedAt, pc.compensable), nil
}
