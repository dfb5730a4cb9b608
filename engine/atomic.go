package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/ratchet-run/ratchet/internal/crashpoint"
	"github.com/ratchet-run/ratchet/steps"
)

// AtomicOpts are options for Atomic, typed by the phase's output T. A nil
// *AtomicOpts is valid.
type AtomicOpts[T any] struct {
	// Compensate is the phase's undo, run in a transaction of its own,
	// with done, the phase's committed output, if the run later fails
	// permanently or is cancelled before its pivot; it is journaled as the
	// phase "undo:<name>" in that transaction (docs/compensation.md).
	Compensate func(ctx context.Context, tx pgx.Tx, done T) error
	// Pivot makes this phase the run's pivot: once it commits, the run no
	// longer compensates — a later failure is retried forward, and a
	// cancellation is refused (ErrPastPivot). A cancellation asked before
	// it refuses its commit instead, in the same fenced statement: a run
	// is either compensated or carried through, never both. At most one
	// phase of a run is its pivot.
	Pivot bool
}

// Atomic runs fn as the phase called name, inside a transaction that also
// writes the phase's journal row and moves the run's recovery point, fenced
// by the lease token: fn's writes commit if and only if the phase does.
//
// On a resumed run whose journal already holds the phase, fn does not run
// and the journaled output is returned. If fn returns an error, the
// transaction rolls back, the recovery point stays, and the error is
// returned for the workflow to handle or return.
//
// Phases of one run are called one after another, never concurrently, and
// in the same order on every execution; names are unique within a run.
func Atomic[T any](ctx context.Context, name string, fn func(ctx context.Context, tx pgx.Tx) (T, error), opts *AtomicOpts[T]) (T, error) {
	if opts == nil {
		opts = &AtomicOpts[T]{}
	}
	var undo func(T) *compensator
	if opts.Compensate != nil {
		undo = func(done T) *compensator {
			return &compensator{atomic: func(ctx context.Context, tx pgx.Tx) error { return opts.Compensate(ctx, tx, done) }}
		}
	}
	return phase(ctx, name, KindAtomic, func(ctx context.Context, ex *execution, seq int, _ steps.Key) (T, error) {
		return runAtomic(ctx, ex, seq, name, fn, opts)
	}, undo)
}

// phase is what every kind of phase shares: find the execution, take the
// next journal position, and either replay the journaled phase or run it,
// between the hooks. A step's child key is derived here, so that the hooks
// see it. A phase that succeeds (run or replayed) with an undo registers
// it for compensation.
func phase[T any](ctx context.Context, name string, kind PhaseKind, run func(ctx context.Context, ex *execution, seq int, key steps.Key) (T, error), undo func(T) *compensator) (T, error) {
	var zero T
	ex, err := executionFrom(ctx)
	if err != nil {
		return zero, err
	}
	if cause := context.Cause(ctx); errors.Is(cause, ErrLeaseLost) {
		// No phase begins on a lease that may be another executor's.
		return zero, cause
	}
	if kind != KindAtomic {
		// Any other phase may act outside the process (a call downstream,
		// a wait): the step result the execution holds is durable first.
		// An atomic phase carries it in its own transaction (runAtomic).
		if err := ex.flush(ctx); err != nil {
			return zero, err
		}
	}
	memo, seq, err := ex.enter(name)
	if err != nil {
		return zero, err
	}
	var key steps.Key
	if kind == KindStep {
		if key, err = ex.childKey(name); err != nil {
			return zero, err
		}
	}
	ctx, end := ex.hooks.Phase(ctx, ex.phaseInfo(name, kind, seq, memo != nil, string(key)))
	out, err := func() (T, error) {
		defer ex.leave()
		if memo != nil {
			out, err := replay[T](memo)
			if err != nil && memo.Error == nil {
				ex.noteReplayFailure(seq, err) // the output no longer decodes
			}
			return out, err
		}
		return run(ctx, ex, seq, key)
	}()
	if err == nil && undo != nil {
		ex.register(name, undo(out))
	}
	if err == nil && memo == nil && crashpoint.Hit(ctx, name) {
		// The test kit's crash: the phase committed, and the process
		// "dies" before anything else is written.
		ex.lose(crashpoint.ErrCrashed)
		out, err = zero, crashpoint.ErrCrashed
	}
	if err == nil && memo == nil && ex.holdEnd(seq, end) {
		// A step whose result the execution holds: its end waits for the
		// commit that makes the result durable (deferred.go).
		return out, nil
	}
	end(err)
	return out, err
}

// replay answers a phase from its journal row: its output, or the permanent
// failure it recorded.
func replay[T any](p *Phase) (T, error) {
	if p.Error != nil {
		var zero T
		return zero, &steps.PermanentError{Code: p.Error.Code, Err: errors.New(p.Error.Message)}
	}
	return decodeOutput[T](p)
}

func runAtomic[T any](ctx context.Context, ex *execution, seq int, name string, fn func(context.Context, pgx.Tx) (T, error), opts *AtomicOpts[T]) (T, error) {
	var zero T
	tx, err := ex.c.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: ex.c.beginPhase})
	if err != nil {
		return zero, fmt.Errorf("engine: phase %q: begin: %w", name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	out, err := fn(ctx, tx)
	if err != nil {
		if ctx.Err() == nil && steps.Classify(err) == steps.ClassPermanent {
			// Journaled, as a step's is, so that a workflow that branches
			// on the failure takes the same branch on every replay.
			tx.Rollback(ctx) //nolint:errcheck // the phase's writes are undone either way
			return zero, ex.commitFailure(ctx, phaseRecord{seq: seq, name: name, kind: KindAtomic, attempts: 1}, err)
		}
		return zero, err
	}
	raw, out, err := journaled(name, out)
	if err != nil {
		return zero, err
	}
	carried, err := ex.carry(ctx, tx)
	if err != nil {
		return zero, err
	}
	cancel, err := ex.commitPhase(ctx, tx, phaseRecord{seq: seq, name: name, kind: KindAtomic, output: raw, attempts: 1,
		compensable: opts.Compensate != nil, pivot: opts.Pivot})
	if err == nil {
		if err = tx.Commit(ctx); err != nil {
			err = ex.breakOff(fmt.Errorf("engine: phase %q: commit: %w", name, err))
		}
	}
	if carried != nil {
		// The step's result committed (or failed to) with this phase.
		ex.settle(carried, cancel, err) //nolint:errcheck // err is returned below
	}
	if err != nil {
		return zero, err
	}
	ex.committed(name, cancel)
	if opts.Pivot {
		ex.passPivot()
	}
	return out, nil
}

func decodeOutput[T any](p *Phase) (T, error) {
	var out T
	if err := json.Unmarshal(p.Output, &out); err != nil {
		return out, steps.Permanent("invalid_output", fmt.Errorf("phase %q: decode journaled output: %w", p.Name, err))
	}
	return out, nil
}

// phaseRecord is a journal row to write.
type phaseRecord struct {
	seq       int
	name      string
	kind      PhaseKind
	output    []byte
	childKey  *string
	attempts  int
	err       *RunError
	startedAt *time.Time // nil: the transaction's start
	// compensable records that the phase registered an undo; pivot makes
	// it the run's pivot (refused, as an atomic phase is, when a
	// cancellation is pending).
	compensable, pivot bool
}

// commitPhaseSQL writes a journal row and advances the recovery point in one
// statement, fenced by the lease token: when the token no longer matches,
// the UPDATE matches nothing, the INSERT selects nothing, and no row changes.
//
// It also honours cancellation without a round trip of its own: when one
// has been requested, an atomic phase ($11 false) is refused, so that its
// transaction rolls back and the run stops at this boundary; a step's
// result ($11 true) is committed anyway, since the call has happened. The
// last two columns say which of these befell a refused commit (read from
// the statement's snapshot: a race with a concurrent change reads as a lost
// lease, which stops the execution just as safely).
const commitPhaseSQL = `
WITH advanced AS (
	UPDATE ratchet.runs SET recovery_point = $3, waiting_for = NULL, updated_at = now(),
		pivot = CASE WHEN $13 THEN $3 ELSE pivot END
	WHERE id = $1 AND lease_token = $2 AND finished_at IS NULL
		AND (cancel_requested_at IS NULL OR $11)
	RETURNING id, attempt, cancel_requested_at IS NOT NULL AS cancel
), journaled AS (
	INSERT INTO ratchet.phases (run_id, seq, name, kind, output, child_key, attempts, error, started_at, finished_at, compensable, execution)
	SELECT id, $4, $3, $5, $6, $7, $8, $9, coalesce($10, now()), clock_timestamp(), $12, attempt FROM advanced
	RETURNING 1
)
SELECT committed, coalesce((SELECT cancel FROM advanced), false),
	-- Only a refused commit looks at the run again (CASE is lazy).
	CASE WHEN committed THEN false ELSE coalesce((
		SELECT lease_token = $2 AND finished_at IS NULL AND cancel_requested_at IS NOT NULL
		FROM ratchet.runs WHERE id = $1), false) END
FROM (SELECT EXISTS (SELECT 1 FROM journaled) AS committed) outcome`

// commitPhase runs commitPhaseSQL in tx (an atomic phase's transaction),
// or, when tx is nil (a step's result), by itself through the client's
// coalescer. A refused commit returns ErrCancelled (the run is to stop
// here) or a lease-lost error (the execution is cancelled); either way the
// caller must roll back. cancel reports a cancellation to honour at the
// next boundary.
//
// A commit by itself first commits the step result the execution holds
// (see deferStep), so that the journal stays in order.
func (ex *execution) commitPhase(ctx context.Context, tx pgx.Tx, p phaseRecord) (cancel bool, err error) {
	if tx == nil {
		if err := ex.flush(ctx); err != nil {
			return false, err
		}
	}
	pc, err := ex.phaseCommit(p)
	if err != nil {
		return false, err
	}
	var out phaseOutcome
	var db dbtx = ex.c.pool
	if tx != nil {
		db = tx
		err = tx.QueryRow(ctx, commitPhaseSQL, pc.args()...).Scan(&out.Committed, &out.Cancel, &out.RefusedForCancel)
	} else {
		err = ex.c.commits.commitPhase(ctx, pc, &out)
	}
	switch {
	case err != nil:
		return false, ex.breakOff(fmt.Errorf("engine: phase %q: commit journal: %w", p.name, err))
	case out.Committed:
		return out.Cancel, nil
	case !out.RefusedForCancel:
		// The statement judged from its snapshot. A cancellation that
		// committed while this commit waited for the run's row lock is not
		// in it: ask again, in a statement of its own (only a refused
		// commit pays for it), before reporting the lease lost.
		if err := db.QueryRow(ctx, cancelledMeanwhileSQL, ex.run.ID, ex.run.LeaseToken).Scan(&out.RefusedForCancel); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return false, ex.breakOff(fmt.Errorf("engine: phase %q: read refused commit: %w", p.name, err))
		}
		if !out.RefusedForCancel {
			return false, ex.leaseLost(ctx)
		}
	}
	ex.mu.Lock()
	ex.cancelled, ex.stopped = true, true
	ex.mu.Unlock()
	return false, ErrCancelled
}

// phaseCommit is p, fenced by the execution's lease, ready to send.
func (ex *execution) phaseCommit(p phaseRecord) (*phaseCommit, error) {
	pc := &phaseCommit{phaseRecord: p, runID: ex.run.ID, token: ex.run.LeaseToken}
	if p.err != nil {
		var err error
		if pc.errJSON, err = json.Marshal(p.err); err != nil {
			return nil, err
		}
	}
	return pc, nil
}

// commitFailure journals a phase's permanent failure, fenced, and returns
// the failure (or why it could not be journaled). A replay returns it
// again (see replay).
func (ex *execution) commitFailure(ctx context.Context, rec phaseRecord, failure error) error {
	rec.err = classify(failure)
	var perm *steps.PermanentError
	if errors.As(failure, &perm) && perm.Err != nil {
		rec.err.Message = perm.Err.Error() // replay re-wraps it with the code
	}
	commitCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stepCommitTimeout)
	defer cancel()
	cancelled, err := ex.commitPhase(commitCtx, nil, rec)
	if err != nil {
		return err
	}
	ex.committed(rec.name, cancelled)
	return failure
}

// cancelledMeanwhileSQL says whether the run is still this execution's and
// a cancellation has been asked of it.
const cancelledMeanwhileSQL = `
SELECT lease_token = $2 AND finished_at IS NULL AND cancel_requested_at IS NOT NULL
FROM ratchet.runs WHERE id = $1`

// enter reserves the next journal position for phase name. It returns the
// journaled phase when the position is already committed (memo), and fails
// the run when the name contradicts the journal.
func (ex *execution) enter(name string) (memo *Phase, seq int, err error) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	switch {
	case ex.parked != nil:
		return nil, 0, errParked
	case ex.fatal != nil:
		return nil, 0, ex.fatal
	case ex.broken != nil:
		return nil, 0, ex.broken
	case ex.inPhase:
		ex.fatal = &phaseUsageError{code: CodeInvalidPhase, msg: fmt.Sprintf("phase %q called while another phase of the run is in progress: phases must run one after another", name)}
		return nil, 0, ex.fatal
	case name == "" || !utf8.ValidString(name) || utf8.RuneCountInString(name) > 255:
		ex.fatal = &phaseUsageError{code: CodeInvalidPhase, msg: fmt.Sprintf("phase name %q: want 1..255 characters of UTF-8", name)}
		return nil, 0, ex.fatal
	case reservedPhaseName(name):
		ex.fatal = &phaseUsageError{code: CodeInvalidPhase, msg: fmt.Sprintf("phase name %q: %q and names beginning %q or %q are the engine's", name, undoPhase, undoPrefix, patchPrefix)}
		return nil, 0, ex.fatal
	}
	seq = ex.next
	if seq < len(ex.journal) {
		// Journaled phases replay even when the run is to stop: replaying
		// has no effect, and it registers the undos a compensation needs.
		j := &ex.journal[seq]
		if j.Name != name {
			ex.fatal = &NonDeterminismError{Seq: seq, Journaled: j.Name, Called: name}
			return nil, 0, ex.fatal
		}
		ex.next++
		ex.used[name] = true
		ex.inPhase = true
		return j, seq, nil
	}
	switch {
	case ex.dry:
		// The deploy gate's replay has reached the end of the journal:
		// the run is compatible.
		ex.dryEnd = true
		return nil, 0, errDryEnd
	case ex.compensating:
		// A run resumed to compensate replays its journal only, to
		// register its undos; it goes no further forward.
		return nil, 0, errCompensating
	case ex.cancelled:
		ex.stopped = true
		return nil, 0, ErrCancelled
	case ex.spent != nil:
		// The journal is replayed (registering the undos a compensation
		// needs), and nothing new runs.
		ex.fatal = ex.spent
		return nil, 0, ex.fatal
	case ex.used[name]:
		ex.fatal = &phaseUsageError{code: CodeDuplicatePhase, msg: fmt.Sprintf("phase name %q used twice in one run", name)}
		return nil, 0, ex.fatal
	}
	ex.inPhase = true
	return nil, seq, nil
}

// committed records that the phase entered last is in the journal, and
// whether a cancellation is pending.
func (ex *execution) committed(name string, cancel bool) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.next++
	ex.used[name] = true
	ex.cancelled = ex.cancelled || cancel
}

func (ex *execution) leave() {
	ex.mu.Lock()
	ex.inPhase = false
	ex.mu.Unlock()
}

// breakOff marks the execution as unable to continue safely and returns err.
func (ex *execution) breakOff(err error) error {
	ex.mu.Lock()
	if ex.broken == nil {
		ex.broken = err
	}
	ex.mu.Unlock()
	return err
}

// childKey derives the key of the run's step named name, in the run's
// format.
func (ex *execution) childKey(name string) (steps.Key, error) {
	return ex.run.ChildKey(name)
}

func (ex *execution) phaseInfo(name string, kind PhaseKind, seq int, replayed bool, childKey string) PhaseInfo {
	return PhaseInfo{
		RunID: ex.run.ID, Workflow: ex.run.Workflow, Name: name, Kind: kind, Seq: seq,
		LeaseToken: ex.run.LeaseToken, Attempt: ex.run.Attempt, Replayed: replayed, ChildKey: childKey,
	}
}
