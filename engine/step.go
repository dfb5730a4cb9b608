package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ratchet-run/ratchet/steps"
)

// StepOpts are options for Step. A nil *StepOpts is valid.
type StepOpts struct {
	// Policy retries the step. Defaults to Config.StepPolicy.
	Policy *steps.Policy
	// Timeout bounds each attempt; an attempt that runs out of time is
	// indeterminate (it may have happened) and retried with the same key.
	// Defaults to Config.StepTimeout.
	Timeout time.Duration
}

// Step runs fn as the external step called name: outside any transaction,
// with the step's child idempotency key (steps.ChildKey of the run's tenant,
// the run id and name), retried by the policy. The key is also in fn's
// context, so an http.Client using steps.NewTransport sends it as
// Idempotency-Key without further code.
//
// When fn succeeds, its result is committed as the phase, fenced by the
// lease token, in a single statement. When it fails permanently (see
// steps.Classify), the failure is committed instead, so that a resumed run
// gets the same error without calling again. When the policy gives up on a
// retryable or indeterminate failure, nothing is committed and the error is
// returned: a workflow that returns it leaves the run unfinished, to be
// resumed later with the same key.
//
// A crash between fn's call and the commit repeats the call on resume, with
// the same key: the downstream must deduplicate on it.
func Step[T any](ctx context.Context, name string, fn func(ctx context.Context, key steps.Key) (T, error), opts *StepOpts) (T, error) {
	return phase(ctx, name, KindStep, func(ctx context.Context, ex *execution, seq int, key steps.Key) (T, error) {
		return runStep(ctx, ex, seq, name, key, fn, opts)
	})
}

func runStep[T any](ctx context.Context, ex *execution, seq int, name string, key steps.Key, fn func(context.Context, steps.Key) (T, error), opts *StepOpts) (T, error) {
	var zero T
	policy, timeout := ex.c.cfg.StepPolicy, ex.c.cfg.StepTimeout
	if opts != nil && opts.Policy != nil {
		policy = *opts.Policy
	}
	if opts != nil && opts.Timeout > 0 {
		timeout = opts.Timeout
	}
	log := ex.c.logger.With(slog.String("run_id", ex.run.ID), slog.String("phase", name), slog.String("child_key", string(key)))

	started := time.Now()
	var out T
	attempts, err := policy.Do(ctx, nil, func(ctx context.Context, attempt int) error {
		actx, cancel := context.WithTimeout(steps.WithKey(ctx, key), timeout)
		defer cancel()
		o, err := fn(actx, key)
		if err == nil {
			out = o
			return nil
		}
		if errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			err = &steps.IndeterminateError{Err: fmt.Errorf("step timed out after %s: %w", timeout, err)}
		}
		log.InfoContext(ctx, "step attempt failed", slog.Int("attempt", attempt),
			slog.String("class", steps.Classify(err).String()), slog.String("error", err.Error()))
		return err
	})
	rec := phaseRecord{seq: seq, name: name, kind: KindStep, childKey: (*string)(&key), attempts: attempts, startedAt: &started}
	// The call has happened: its result is committed even if the execution
	// is being stopped meanwhile (a hand-over at shutdown, a caller gone),
	// so that the next executor does not call again. A superseded
	// execution's commit is refused by the fence as ever.
	commitCtx, cancelCommit := context.WithTimeout(context.WithoutCancel(ctx), stepCommitTimeout)
	defer cancelCommit()
	if err != nil {
		var perm *steps.PermanentError
		if ctx.Err() != nil || steps.Classify(err) != steps.ClassPermanent {
			return zero, fmt.Errorf("engine: step %q: %w", name, err)
		}
		rec.err = classify(err)
		if errors.As(err, &perm) && perm.Err != nil {
			rec.err.Message = perm.Err.Error() // replay re-wraps it with the code
		}
		cancel, cerr := ex.commitPhase(commitCtx, ex.c.pool, rec)
		if cerr != nil {
			return zero, cerr
		}
		ex.committed(name, cancel)
		return zero, err
	}
	raw, out, err := journaled(name, out)
	if err != nil {
		return zero, err
	}
	rec.output = raw
	cancel, err := ex.commitPhase(commitCtx, ex.c.pool, rec)
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
