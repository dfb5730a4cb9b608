package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratchet-run/ratchet/steps"
)

// AwaitOpts are options for Await. A nil *AwaitOpts is valid.
type AwaitOpts struct {
	// CorrelationKey makes the run also receive the signals sent by this
	// key (SignalParams.CorrelationKey) within its tenant: a transfer id
	// the bank echoes in its webhook, say. Signals sent to the run itself
	// are received either way.
	CorrelationKey string
	// Timeout ends the wait: Await then returns an *AwaitTimeoutError. It
	// runs from when the run first reaches the Await, by the database's
	// clock. Zero waits for ever.
	Timeout time.Duration
}

// AwaitTimeoutError is what Await returns when its timeout passed before a
// signal came. It is journaled like any outcome, so a replay returns it
// again: a workflow can branch on it (errors.As) and stay deterministic.
type AwaitTimeoutError struct {
	Signal  string
	Timeout time.Duration
}

func (e *AwaitTimeoutError) Error() string {
	return fmt.Sprintf("engine: no signal %q within %s", e.Signal, e.Timeout)
}

// awaitOutput is an await phase's journaled outcome: the signal, or the
// timeout.
type awaitOutput struct {
	Payload  json.RawMessage `json:"payload,omitempty"`
	EventID  string          `json:"event_id,omitempty"`
	TimedOut bool            `json:"timed_out,omitempty"`
}

// Await is a phase that waits for the signal called name (Client.Signal),
// holding nothing meanwhile, and returns its payload decoded as T. A
// signal sent before the run awaits is kept in the inbox and consumed
// here at once; otherwise the run parks (status waiting) and the execution
// ends — the workflow must return Await's error then — until a signal
// arrives, which makes the run due at once, or the timeout passes. The
// signal and the timeout meet in the phase's fenced commit: exactly one
// is journaled, and a replay returns it.
//
// The phase is named name, so a run awaits each signal name once.
func Await[T any](ctx context.Context, name string, opts *AwaitOpts) (T, error) {
	if opts == nil {
		opts = &AwaitOpts{}
	}
	var zero T
	out, err := phase(ctx, name, KindSignal, func(ctx context.Context, ex *execution, seq int, _ steps.Key) (awaitOutput, error) {
		return runAwait(ctx, ex, seq, name, opts)
	}, nil)
	if err != nil {
		return zero, err
	}
	if out.TimedOut {
		return zero, &AwaitTimeoutError{Signal: name, Timeout: opts.Timeout}
	}
	var v T
	if err := json.Unmarshal(out.Payload, &v); err != nil {
		err = steps.Permanent("invalid_signal", fmt.Errorf("signal %q (event %s): payload does not decode: %w", name, out.EventID, err))
		if ex, eerr := executionFrom(ctx); eerr == nil {
			ex.noteReplayFailure(ex.positionOf(name), err)
		}
		return zero, err
	}
	return v, nil
}

// addressLockSQL serialises an Await's look at the inbox with deliveries
// to the same address, so that a signal is either seen by the Await or
// delivered after the run is parked (and then wakes it): never lost
// between the two.
const addressLockSQL = `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`

func signalAddress(tenant, name, kind, value string) string {
	return tenant + "\x1f" + name + "\x1f" + kind + "\x1f" + value // no part holds a control character
}

// consumeSignalSQL takes the oldest unconsumed, unexpired signal for the
// run: sent to it, or by its correlation key.
const consumeSignalSQL = `
UPDATE ratchet.signals SET consumed_by = $1, consumed_at = now()
WHERE id = (
	SELECT id FROM ratchet.signals
	WHERE consumed_at IS NULL AND expires_at > now() AND name = $2
		AND (run_id = $1 OR (tenant = $3 AND correlation_key = $4))
	ORDER BY id LIMIT 1
	FOR UPDATE SKIP LOCKED)
RETURNING payload, event_id`

func runAwait(ctx context.Context, ex *execution, seq int, name string, opts *AwaitOpts) (awaitOutput, error) {
	var none awaitOutput
	if opts.CorrelationKey != "" && len(opts.CorrelationKey) > 255 {
		return none, steps.Permanent(CodeInvalidPhase, fmt.Errorf("await %q: correlation key longer than 255 bytes", name))
	}
	tx, err := ex.c.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: ex.c.beginPhase})
	if err != nil {
		return none, fmt.Errorf("engine: phase %q: begin: %w", name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	run := ex.run
	if _, err := tx.Exec(ctx, addressLockSQL, signalAddress(run.Tenant, name, "run", run.ID)); err != nil {
		return none, fmt.Errorf("engine: phase %q: lock: %w", name, err)
	}
	if opts.CorrelationKey != "" {
		if _, err := tx.Exec(ctx, addressLockSQL, signalAddress(run.Tenant, name, "key", opts.CorrelationKey)); err != nil {
			return none, fmt.Errorf("engine: phase %q: lock: %w", name, err)
		}
	}

	commit := func(out awaitOutput) (awaitOutput, error) {
		return commitWait(ctx, ex, tx, seq, name, KindSignal, out)
	}

	var out awaitOutput
	err = tx.QueryRow(ctx, consumeSignalSQL, run.ID, name, run.Tenant, opts.CorrelationKey).Scan(&out.Payload, &out.EventID)
	switch {
	case err == nil:
		return commit(out)
	case !errors.Is(err, pgx.ErrNoRows):
		return none, fmt.Errorf("engine: phase %q: inbox: %w", name, notMigrated(err))
	}

	// No signal: has the timeout passed? It is fixed when the run first
	// parks here.
	var until *time.Time
	if w := run.WaitingFor; w != nil && w.Seq == seq && w.Phase == name {
		until = w.Until
	}
	if until != nil || opts.Timeout > 0 {
		var wake time.Time
		var due bool
		if err := tx.QueryRow(ctx, wakeSQL, until, opts.Timeout).Scan(&wake, &due); err != nil {
			return none, fmt.Errorf("engine: phase %q: timeout: %w", name, err)
		}
		if due {
			return commit(awaitOutput{TimedOut: true})
		}
		until = &wake
	}

	return none, parkIn(ctx, ex, tx, StatusWaiting, &Wait{Kind: KindSignal, Phase: name, Seq: seq, Until: until, Signal: name, CorrelationKey: opts.CorrelationKey})
}
