package engine

import (
	"fmt"
	"time"

	"github.com/ratchet-run/ratchet/steps"
)

// RetryPolicy says when a run that failed retryably — its workflow
// returned an error that is not permanent, or an execution timed out — is
// executed again from its recovery point, and when it gives up. Waits grow
// exponentially from InitialInterval by Multiplier up to MaxInterval, each
// spread by ±Jitter; an error made with steps.RetryAfter sets the wait
// itself. The zero value of every field selects its default: retry for
// ever, waiting 1s doubling to 5 minutes.
//
// A run whose executions have failed MaxAttempts times, or whose next
// execution would begin more than MaxElapsed after the run was created,
// fails with code CodeRetriesExhausted and its last error's message (and
// compensates, if it has undos); Client.Reopen gives it another round.
// Only failures count (Run.Failures): an execution that parks — a sleep,
// a signal or child wait, a key's slot taken — spends nothing, however
// often the run wakes.
type RetryPolicy struct {
	// InitialInterval is the wait after the first failed execution.
	// Defaults to 1s.
	InitialInterval time.Duration
	// Multiplier grows the wait after each failure. Defaults to 2.
	Multiplier float64
	// MaxInterval caps a computed wait (not a steps.RetryAfter). Defaults
	// to 5 minutes.
	MaxInterval time.Duration
	// Jitter spreads each computed wait by this fraction either way, so
	// that runs failed together do not retry together. Defaults to 0.2;
	// negative disables it.
	Jitter float64
	// MaxAttempts bounds the failed executions of a run: those that
	// ended in a retryable error, and those lost to a crash (their lease
	// expired). With 3, a run is executed again after its first and
	// second failures and gives up at its third. Zero: no bound.
	MaxAttempts int
	// MaxElapsed bounds the time from the run's creation to the start of
	// its last execution. Zero: no bound.
	MaxElapsed time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.InitialInterval == 0 {
		p.InitialInterval = time.Second
	}
	if p.Multiplier == 0 {
		p.Multiplier = 2
	}
	if p.MaxInterval == 0 {
		p.MaxInterval = 5 * time.Minute
	}
	if p.Jitter == 0 {
		p.Jitter = 0.2
	}
	return p
}

func (p RetryPolicy) validate() error {
	switch {
	case p.InitialInterval < 0, p.MaxInterval < 0, p.MaxElapsed < 0, p.MaxAttempts < 0:
		return fmt.Errorf("retry policy: negative interval, bound or attempts: %+v", p)
	case p.Multiplier < 1:
		return fmt.Errorf("retry policy: multiplier %v is less than 1", p.Multiplier)
	case p.Jitter >= 1:
		return fmt.Errorf("retry policy: jitter %v must be below 1", p.Jitter)
	}
	return nil
}

// delay is the wait after the run's failed-th failure, with err.
func (p RetryPolicy) delay(failed int, err error) time.Duration {
	sp := steps.Policy{InitialInterval: p.InitialInterval, Multiplier: p.Multiplier, MaxInterval: p.MaxInterval, Jitter: p.Jitter}
	return sp.Delay(max(failed, 1), err)
}

// givesUp reports whether no execution should follow the run's failed-th
// failure, for a run created at created whose next would begin after
// wait.
func (p RetryPolicy) givesUp(failed int, created time.Time, wait time.Duration) bool {
	return p.spent(failed) || (p.MaxElapsed > 0 && time.Since(created)+wait > p.MaxElapsed)
}

// spent reports whether failed failures reach MaxAttempts.
func (p RetryPolicy) spent(failed int) bool {
	return p.MaxAttempts > 0 && failed >= p.MaxAttempts
}

// exhausted is the error a run fails with when its policy gives up after
// its failed-th failure.
func exhausted(failed int, last *RunError) *RunError {
	return &RunError{
		Code:    CodeRetriesExhausted,
		Message: fmt.Sprintf("gave up after %d failed executions; the last failed with %s: %s", failed, last.Code, last.Message),
	}
}

// lostExhausted is the error a run fails with when an execution lost to a
// crash spent its policy's last attempt.
func lostExhausted(failed int) *phaseUsageError {
	return &phaseUsageError{code: CodeRetriesExhausted, msg: fmt.Sprintf(
		"gave up after %d failed executions; the last was lost (its lease expired: a crash or a lost connection)", failed)}
}
