package steps

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// Policy says how often and for how long a step is retried. Waits grow
// exponentially from InitialInterval by Multiplier up to MaxInterval, each
// spread by ±Jitter; a downstream's Retry-After replaces the computed wait.
// The policy gives up after MaxAttempts attempts, or when the next wait
// would end past MaxElapsed since the first attempt, whichever comes first.
//
// The zero value of every field selects its default.
type Policy struct {
	// InitialInterval is the wait after the first failure. Defaults to 100ms.
	InitialInterval time.Duration
	// Multiplier grows the wait after each failure. Defaults to 2.
	Multiplier float64
	// MaxInterval caps a computed wait (not a Retry-After). Defaults to 10s.
	MaxInterval time.Duration
	// MaxAttempts bounds the attempts, the first included. Defaults to 5.
	MaxAttempts int
	// MaxElapsed bounds the time from the first attempt to the start of the
	// last. Defaults to 1 minute.
	MaxElapsed time.Duration
	// Jitter spreads each computed wait uniformly by this fraction either
	// way. Defaults to 0.2; negative disables it.
	Jitter float64
}

// WithDefaults returns p with every unset field at its default.
func (p Policy) WithDefaults() Policy {
	if p.InitialInterval == 0 {
		p.InitialInterval = 100 * time.Millisecond
	}
	if p.Multiplier == 0 {
		p.Multiplier = 2
	}
	if p.MaxInterval == 0 {
		p.MaxInterval = 10 * time.Second
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = 5
	}
	if p.MaxElapsed == 0 {
		p.MaxElapsed = time.Minute
	}
	if p.Jitter == 0 {
		p.Jitter = 0.2
	}
	return p
}

// Validate reports a policy that cannot work.
func (p Policy) Validate() error {
	p = p.WithDefaults()
	switch {
	case p.InitialInterval < 0, p.MaxInterval < 0, p.MaxElapsed < 0:
		return fmt.Errorf("steps: policy durations must not be negative: %+v", p)
	case p.Multiplier < 1:
		return fmt.Errorf("steps: policy multiplier %v is less than 1", p.Multiplier)
	case p.MaxAttempts < 1:
		return fmt.Errorf("steps: policy max attempts %d is less than 1", p.MaxAttempts)
	case p.Jitter >= 1:
		return fmt.Errorf("steps: policy jitter %v must be below 1", p.Jitter)
	}
	return nil
}

// Delay returns the wait after the attempt-th attempt failed with err: the
// downstream's Retry-After if err carries one, else the exponential backoff
// with jitter.
func (p Policy) Delay(attempt int, err error) time.Duration {
	p = p.WithDefaults()
	if ra := retryAfter(err); ra > 0 {
		return ra
	}
	d := float64(p.InitialInterval)
	for i := 1; i < attempt && d < float64(p.MaxInterval); i++ {
		d *= p.Multiplier
	}
	d = min(d, float64(p.MaxInterval))
	if p.Jitter > 0 {
		d *= 1 + p.Jitter*(2*rand.Float64()-1)
	}
	return time.Duration(d)
}

// Clock is the time source of Do; tests replace it.
type Clock interface {
	Now() time.Time
	// Sleep waits for d or until ctx ends, returning ctx's error then.
	Sleep(ctx context.Context, d time.Duration) error
}

// SystemClock is the real clock.
type SystemClock struct{}

func (SystemClock) Now() time.Time { return time.Now() }

func (SystemClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Do calls fn until it succeeds, fails permanently, ctx ends or the policy
// gives up, waiting between attempts by Delay. It returns the number of
// attempts made and, on failure, the permanent error, ctx's error, or an
// *ExhaustedError wrapping the last failure. A nil clock is the system clock.
func (p Policy) Do(ctx context.Context, clock Clock, fn func(ctx context.Context, attempt int) error) (attempts int, err error) {
	p = p.WithDefaults()
	if clock == nil {
		clock = SystemClock{}
	}
	start := clock.Now()
	for attempt := 1; ; attempt++ {
		err := fn(ctx, attempt)
		switch {
		case err == nil:
			return attempt, nil
		case ctx.Err() != nil:
			return attempt, fmt.Errorf("steps: attempt %d: %w", attempt, context.Cause(ctx))
		case Classify(err) == ClassPermanent:
			return attempt, err
		}
		elapsed := clock.Now().Sub(start)
		wait := p.Delay(attempt, err)
		if attempt >= p.MaxAttempts || elapsed+wait > p.MaxElapsed {
			return attempt, &ExhaustedError{Attempts: attempt, Elapsed: elapsed, Last: err}
		}
		if err := clock.Sleep(ctx, wait); err != nil {
			return attempt, fmt.Errorf("steps: waiting to retry: %w", context.Cause(ctx))
		}
	}
}
