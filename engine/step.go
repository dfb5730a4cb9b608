package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/ratchet-run/ratchet/internal/crashpoint"
	"github.com/ratchet-run/ratchet/steps"
)

// StepOpts are options for Step, typed by the step's output T. A nil
// *StepOpts is valid.
type StepOpts[T any] struct {
	// Policy retries the step. Defaults to Config.StepPolicy.
	Policy *steps.Policy
	// Timeout bounds each attempt; an attempt that runs out of time is
	// indeterminate (it may have happened) and retried with the same key.
	// Defaults to Config.StepTimeout.
	Timeout time.Duration

	// Compensate is the step's undo (a refund for a charge): if the run
	// later fails permanently or is cancelled before its pivot, it is
	// called with done, the step's committed output, and a child key of
	// its own (the key of the phase "undo:<name>"), and journaled as that
	// phase. Retried until it succeeds (docs/compensation.md).
	Compensate func(ctx context.Context, key steps.Key, done T) error

	// Reconcile asks the downstream whether the effect sent under key
	// happened, and what it was: found reports that it did, with the
	// result the step would have returned. When an earlier attempt's
	// outcome is unknown — it timed out, its answer was lost, or a
	// resumed run finds the step begun but not journaled — the engine
	// asks Reconcile before sending anything again, and a found result is
	// committed as the step's output without another call. An error is
	// an attempt's failure, retried by Policy.
	Reconcile func(ctx context.Context, key steps.Key) (result T, found bool, err error)

	// KeyWindow is how long the downstream remembers an idempotency key
	// (Stripe: at least 24 hours). A repeat that might reach it later than
	// this after the step could first have been sent is not a repeat but
	// a new effect: the engine then reconciles, and without Reconcile it
	// parks the run for an operator (Wait.Kind KindReconcile) instead of
	// calling. Zero means the downstream never forgets a key.
	KeyWindow time.Duration

	// RepeatUnknown repeats an attempt whose outcome is unknown with the
	// same key while that is safe (inside KeyWindow), and reconciles only
	// past it. By default, a step with Reconcile reconciles every unknown
	// outcome first, which spares the downstream a second request.
	RepeatUnknown bool
}

// Step runs fn as the external step called name: outside any transaction,
// with the step's child idempotency key (steps.ChildKey of the run's tenant,
// the run id and name), retried by the policy. The key is also in fn's
// context, so an http.Client using steps.NewTransport sends it as
// Idempotency-Key without further code.
//
// When fn succeeds, its result is committed as the phase, fenced by the
// lease token, by the run's next commit: with the next atomic phase's
// transaction or the run's finish when one of those follows, and by
// itself before any other phase begins (Config.CommitStepsAlone commits
// it before Step returns). Nothing the workflow does can reach downstream
// before it is durable. When it fails permanently (see
// steps.Classify), the failure is committed instead, so that a resumed run
// gets the same error without calling again. When the policy gives up on a
// retryable or indeterminate failure, nothing is committed and the error is
// returned: a workflow that returns it leaves the run unfinished, to be
// resumed later with the same key.
//
// A crash between fn's call and the commit repeats the call on resume, with
// the same key: the downstream must deduplicate on it — or, past its key
// window, be reconciled (see StepOpts).
func Step[T any](ctx context.Context, name string, fn func(ctx context.Context, key steps.Key) (T, error), opts *StepOpts[T]) (T, error) {
	if opts == nil {
		opts = &StepOpts[T]{}
	}
	return phase(ctx, name, KindStep, func(ctx context.Context, ex *execution, seq int, key steps.Key) (T, error) {
		return runStep(ctx, ex, seq, name, key, fn, opts)
	}, opts.compensator())
}

// compensator adapts the step's undo to what the execution registers: it
// is retried by the step's own policy and timeout.
func (o *StepOpts[T]) compensator() func(T) *compensator {
	if o.Compensate == nil {
		return nil
	}
	return func(done T) *compensator {
		return &compensator{policy: o.Policy, timeout: o.Timeout,
			step: func(ctx context.Context, key steps.Key) error { return o.Compensate(ctx, key, done) }}
	}
}

// errMustReconcile ends a step's retries: its next attempt might reach the
// downstream after its key window, and only reconciliation could say
// whether the effect happened.
var errMustReconcile = errors.New("engine: the step's outcome is unknown and a repeat may be past the downstream's key window")

func runStep[T any](ctx context.Context, ex *execution, seq int, name string, key steps.Key, fn func(context.Context, steps.Key) (T, error), opts *StepOpts[T]) (T, error) {
	var zero T
	policy, timeout := ex.c.cfg.StepPolicy, ex.c.cfg.StepTimeout
	if opts.Policy != nil {
		policy = *opts.Policy
	}
	if opts.Timeout > 0 {
		timeout = opts.Timeout
	}
	log := ex.c.logger.With(slog.String("run_id", ex.run.ID), slog.String("phase", name), slog.String("child_key", string(key)))

	started := time.Now()
	u := ex.unknownOutcome(seq, name, started)
	var out T
	reconciled := false
	doCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	attempts, err := policy.Do(doCtx, nil, func(ctx context.Context, attempt int) error {
		actx, cancel := context.WithTimeout(steps.WithKey(ctx, key), timeout)
		defer cancel()
		if u.unknown {
			past, err := u.pastWindow(actx, ex, opts.KeyWindow, timeout)
			if err != nil {
				return err
			}
			switch {
			case opts.Reconcile != nil && (past || !opts.RepeatUnknown):
				o, found, err := opts.Reconcile(actx, key)
				if err != nil {
					log.InfoContext(ctx, "reconciliation failed", slog.Int("attempt", attempt), slog.String("error", err.Error()))
					return err
				}
				ex.c.tel.reconciles.Add(ctx, 1, metric.WithAttributes(attrWorkflow.String(ex.run.Workflow), attrOutcome.String(map[bool]string{true: "found", false: "not_found"}[found])))
				if found {
					out, reconciled = o, true
					return nil
				}
				u.unknown = false // it did not happen: the next call is a first one
			case past:
				stop(errMustReconcile)
				return errMustReconcile
			}
		}
		o, err := fn(actx, key)
		if err == nil {
			out = o
			return nil
		}
		if errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			err = &steps.IndeterminateError{Err: fmt.Errorf("step timed out after %s: %w", timeout, err)}
		}
		if steps.Classify(err) == steps.ClassIndeterminate {
			u.unknown = true
		}
		log.InfoContext(ctx, "step attempt failed", slog.Int("attempt", attempt),
			slog.String("class", steps.Classify(err).String()), slog.String("error", err.Error()))
		return err
	})
	if errors.Is(context.Cause(doCtx), errMustReconcile) && ctx.Err() == nil {
		return zero, u.park(ctx, ex, seq, name, key, opts.KeyWindow)
	}
	if reconciled {
		log.InfoContext(ctx, "step reconciled: the downstream had the effect; not called again", slog.Int("attempts", attempts))
	}
	rec := phaseRecord{seq: seq, name: name, kind: KindStep, childKey: (*string)(&key), attempts: attempts, startedAt: &started}
	// The call has happened: its result is committed even if the execution
	// is being stopped meanwhile (a hand-over at shutdown, a caller gone),
	// so that the next executor does not call again. A superseded
	// execution's commit is refused by the fence as ever.
	commitCtx, cancelCommit := context.WithTimeout(context.WithoutCancel(ctx), stepCommitTimeout)
	defer cancelCommit()
	if err != nil {
		if ctx.Err() != nil || steps.Classify(err) != steps.ClassPermanent {
			return zero, fmt.Errorf("engine: step %q: %w", name, err)
		}
		return zero, ex.commitFailure(ctx, rec, err)
	}
	raw, out, err := journaled(name, out)
	if err != nil {
		return zero, err
	}
	rec.output = raw
	rec.compensable = opts.Compensate != nil
	if !ex.c.cfg.CommitStepsAlone && !crashpoint.Hit(ctx, name) {
		// Committed by the run's next commit (deferred.go). The test kit's
		// crash after this step commits it alone: the crash lands where
		// it names, with nothing written after the step.
		ex.deferStep(rec)
		return out, nil
	}
	cancel, err := ex.commitPhase(commitCtx, nil, rec)
	if err != nil {
		return zero, err
	}
	ex.committed(name, cancel)
	return out, nil
}

// stepCommitTimeout bounds the commit of a step's result.
const stepCommitTimeout = 5 * time.Second

// journaled encodes a phase's output for the journal and returns it as a
// replay will: decoded from those bytes. A value that does not survive the
// round trip (unexported fields, a time's location name) is therefore the
// same on the first execution as on every replay.
func journaled[T any](name string, out T) ([]byte, T, error) {
	var zero T
	raw, err := json.Marshal(out)
	if err != nil {
		return nil, zero, steps.Permanent("invalid_output", fmt.Errorf("phase %q: encode output: %w", name, err))
	}
	var again T
	if err := json.Unmarshal(raw, &again); err != nil {
		return nil, zero, steps.Permanent("invalid_output", fmt.Errorf("phase %q: output does not decode from its own JSON: %w", name, err))
	}
	return raw, again, nil
}
