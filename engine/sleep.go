package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratchet-run/ratchet/steps"
)

// Sleep is a phase that waits for d, by the database's clock, holding
// nothing meanwhile: the first time the run reaches it, the run is parked
// (status waiting, its lease released, due again at the wake time) and
// the execution ends. The wake-up mechanism — any worker's recoverer, or a
// ClaimDue loop — executes the run again at that time; the phase then
// commits and returns, and the workflow continues. The wake time is fixed
// when the run first parks, so a run taken over early (TakeOver) parks
// again until the same time, and replay returns at once.
//
// The workflow must return the error Sleep returns when it parks the run
// (it ends this execution); nothing else may be called in it. A sleep of
// zero or less commits at once.
func Sleep(ctx context.Context, name string, d time.Duration) error {
	return sleep(ctx, name, nil, d)
}

// SleepUntil is Sleep until the time t. For a deterministic workflow, t
// comes from the input or an earlier phase, not from the clock.
func SleepUntil(ctx context.Context, name string, t time.Time) error {
	return sleep(ctx, name, &t, 0)
}

// errParked is what a phase that parked the run returns to the workflow
// (as a *parkedError): the execution ends there, and conclude writes
// nothing more.
var errParked = errors.New("engine: the run is parked until its wait ends; return this error")

// parkedError reports a park and what the run waits for.
type parkedError struct{ wait *Wait }

func (e *parkedError) Error() string {
	if e.wait.Until != nil {
		return fmt.Sprintf("%v (phase %q, until %s)", errParked, e.wait.Phase, e.wait.Until.Format(time.RFC3339Nano))
	}
	return fmt.Sprintf("%v (phase %q)", errParked, e.wait.Phase)
}

func (e *parkedError) Is(target error) bool { return target == errParked }

// sleepOutput is a sleep phase's journaled output.
type sleepOutput struct {
	Until time.Time `json:"until"`
}

// sleep is Sleep (until nil: d from now) and SleepUntil.
func sleep(ctx context.Context, name string, until *time.Time, d time.Duration) error {
	_, err := phase(ctx, name, KindSleep, func(ctx context.Context, ex *execution, seq int, _ steps.Key) (struct{}, error) {
		return struct{}{}, runSleep(ctx, ex, seq, name, until, d)
	}, nil)
	return err
}

// wakeSQL fixes a sleep's wake time — $1 if known, else $2 from now — and
// says whether it has come, by the database's clock.
const wakeSQL = `SELECT w, now() >= w FROM (SELECT coalesce($1::timestamptz, now() + $2::interval) AS w) wake`

// parkSQL parks a run: waiting for what $3 describes, due at $4 (never,
// when NULL), its status $5, its lease released with a new token (fencing
// this execution, which ends), and its concurrency slot given up if $6.
const parkSQL = `
UPDATE ratchet.runs SET
	status = $5,
	holds_slot = holds_slot AND NOT $6,
	waiting_for = $3,
	next_attempt_at = $4,
	lease_token = lease_token + 1,
	lease_owner = NULL,
	lease_expires_at = NULL,
	updated_at = now()
WHERE id = $1 AND lease_token = $2 AND finished_at IS NULL
RETURNING ` + runColumns

func runSleep(ctx context.Context, ex *execution, seq int, name string, until *time.Time, d time.Duration) error {
	tx, err := ex.c.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: ex.c.beginPhase})
	if err != nil {
		return fmt.Errorf("engine: phase %q: begin: %w", name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	// The wake time is the one the run parked with, if it parked here.
	if w := ex.run.WaitingFor; w != nil && w.Seq == seq && w.Phase == name && w.Until != nil {
		until = w.Until
	}
	var wake time.Time
	var due bool
	if err := tx.QueryRow(ctx, wakeSQL, until, d).Scan(&wake, &due); err != nil {
		return fmt.Errorf("engine: phase %q: wake time: %w", name, err)
	}
	if due {
		_, err := commitWait(ctx, ex, tx, seq, name, KindSleep, sleepOutput{Until: wake})
		return err
	}
	return parkIn(ctx, ex, tx, StatusWaiting, &Wait{Kind: KindSleep, Phase: name, Seq: seq, Until: &wake})
}

// commitWait journals a waiting phase's outcome (the sleep's end, the
// signal, the timeout) in its transaction, fenced, and commits it. It
// returns out as a replay will decode it.
func commitWait[T any](ctx context.Context, ex *execution, tx pgx.Tx, seq int, name string, kind PhaseKind, out T) (T, error) {
	var zero T
	raw, out, err := journaled(name, out)
	if err != nil {
		return zero, err
	}
	cancel, err := ex.commitPhase(ctx, tx, phaseRecord{seq: seq, name: name, kind: kind, output: raw, attempts: 1})
	if err != nil {
		return zero, err
	}
	if err := tx.Commit(ctx); err != nil {
		return zero, ex.breakOff(fmt.Errorf("engine: phase %q: commit: %w", name, err))
	}
	ex.committed(name, cancel)
	return out, nil
}

// parkIn parks the run for wait, as status, in the phase's transaction,
// fenced, and commits: the execution is over, and the phase returns the
// error parkIn does.
func parkIn(ctx context.Context, ex *execution, tx pgx.Tx, status Status, wait *Wait) error {
	release := false
	if conc := ex.def.concurrency(); conc != nil {
		release = conc.ReleaseWhileParked
	}
	parked, ok, err := queryRun(ctx, tx, parkSQL, ex.run.ID, ex.run.LeaseToken, wait, wait.Until, status, release)
	if err != nil {
		return ex.breakOff(fmt.Errorf("engine: phase %q: park: %w", wait.Phase, err))
	}
	if !ok {
		return ex.leaseLost(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		return ex.breakOff(fmt.Errorf("engine: phase %q: commit park: %w", wait.Phase, err))
	}
	if release {
		ex.gaveUpSlot()
	}
	ex.park(parked)
	return &parkedError{wait: wait}
}

// park records that the run was parked as run shows it: the execution is
// over, and its heartbeat stops (the lease is no longer this execution's).
func (ex *execution) park(run *Run) {
	ex.mu.Lock()
	ex.parked = run
	ex.mu.Unlock()
	ex.lose(errParked)
}
