package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	"github.com/ratchet-run/ratchet/steps"
)

// outcome tracks, for one step of one execution, whether an earlier
// attempt may have reached the downstream without the engine knowing its
// outcome, and since when: the evidence the key window is judged on.
type outcome struct {
	unknown bool
	// firstDB is the earliest moment the step could first have been sent
	// by an earlier execution, by the database's clock: the commit of the
	// phase before it (or the run's creation). Nil when no earlier
	// execution can have sent it: then firstLocal, when this execution
	// reached the step, by its own monotonic clock.
	firstDB    *time.Time
	firstLocal time.Time
}

// unknownOutcome says whether step name at seq, reached at started, may
// already have been sent. An earlier execution may have sent it when it is
// the first phase past the journal of a run executed before (the code is
// deterministic, so that execution reached this step or stopped short of
// it: which, nothing records — the engine assumes the worse). An operator
// who resumed a run parked here has settled the question.
func (ex *execution) unknownOutcome(seq int, name string, started time.Time) *outcome {
	o := &outcome{firstLocal: started}
	if w := ex.run.WaitingFor; w != nil && w.Kind == KindReconcile && w.Seq == seq && w.Phase == name && w.Resolved {
		return o
	}
	if ex.run.Attempt > 1 && seq == len(ex.journal) {
		first := ex.run.CreatedAt
		if seq > 0 {
			first = ex.journal[seq-1].FinishedAt
		}
		o.unknown, o.firstDB = true, &first
	}
	return o
}

// sinceSQL measures, by the database's clock, the time since a moment it
// recorded.
const sinceSQL = `SELECT (extract(epoch FROM clock_timestamp() - $1::timestamptz) * 1e6)::bigint`

// pastWindow reports whether an attempt sent now might reach the
// downstream after its key window: judged from the earliest moment the
// step could first have been sent, with the attempt's whole timeout added
// (a request may be delivered as late as that).
func (o *outcome) pastWindow(ctx context.Context, ex *execution, window, timeout time.Duration) (bool, error) {
	if window <= 0 {
		return false, nil
	}
	elapsed := time.Since(o.firstLocal)
	if o.firstDB != nil {
		var us int64
		if err := ex.c.pool.QueryRow(ctx, sinceSQL, *o.firstDB).Scan(&us); err != nil {
			return false, fmt.Errorf("engine: measure the key window: %w", err)
		}
		elapsed = time.Duration(us) * time.Microsecond
	}
	return elapsed+timeout >= window, nil
}

// park parks the run for an operator: the step's outcome is unknown, a
// repeat may reach the downstream past its key window (so be a new
// effect), and no Reconcile can ask.
func (o *outcome) park(ctx context.Context, ex *execution, seq int, name string, key steps.Key, window time.Duration) error {
	first := o.firstDB
	if first == nil {
		first = &o.firstLocal
	}
	ex.c.tel.reconciles.Add(ctx, 1, metric.WithAttributes(attrWorkflow.String(ex.run.Workflow), attrOutcome.String("parked")))
	tx, err := ex.c.pool.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("engine: phase %q: park: %w", name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	f := first.UTC()
	return parkIn(ctx, ex, tx, StatusWaiting, &Wait{Kind: KindReconcile, Phase: name, Seq: seq, ChildKey: string(key), FirstAttempt: &f, KeyWindow: window,
		Reason: fmt.Sprintf("the step's outcome is unknown and a repeat may reach the downstream more than %s (its key window) after it was first sent, "+
			"where the key no longer protects it: check the downstream for the child key; resume the run if the effect did not happen, cancel it if it did", window)})
}
