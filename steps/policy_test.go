package steps_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/steps"
)

// fakeClock advances only when the code under test sleeps.
type fakeClock struct {
	now    time.Time
	sleeps []time.Duration
}

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	return nil
}

var noJitter = steps.Policy{InitialInterval: 100 * time.Millisecond, Multiplier: 2, MaxInterval: time.Second, MaxAttempts: 10, MaxElapsed: time.Hour, Jitter: -1}

func TestPolicyDelayGrowsExponentiallyToTheCap(t *testing.T) {
	t.Parallel()
	var got []time.Duration
	for attempt := 1; attempt <= 6; attempt++ {
		got = append(got, noJitter.Delay(attempt, errors.New("x")))
	}
	ms := time.Millisecond
	require.Equal(t, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second}, got)
}

func TestPolicyJitterStaysWithinBounds(t *testing.T) {
	t.Parallel()
	p := noJitter
	p.Jitter = 0.25
	distinct := map[time.Duration]bool{}
	for range 1000 {
		d := p.Delay(3, errors.New("x"))
		require.GreaterOrEqual(t, d, 300*time.Millisecond)
		require.LessOrEqual(t, d, 500*time.Millisecond)
		distinct[d] = true
	}
	require.Greater(t, len(distinct), 10, "jitter spreads the waits")
}

func TestPolicyHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	err := &steps.StatusError{StatusCode: http.StatusTooManyRequests, RetryAfter: 7 * time.Second}
	require.Equal(t, 7*time.Second, noJitter.Delay(1, err), "Retry-After replaces the backoff, even above MaxInterval")

	clock := &fakeClock{now: time.Unix(0, 0)}
	attempts, got := noJitter.Do(context.Background(), clock, func(ctx context.Context, attempt int) error {
		if attempt == 1 {
			return err
		}
		return nil
	})
	require.NoError(t, got)
	require.Equal(t, 2, attempts)
	require.Equal(t, []time.Duration{7 * time.Second}, clock.sleeps)
}

func TestPolicyStopsAtMaxAttempts(t *testing.T) {
	t.Parallel()
	p := noJitter
	p.MaxAttempts = 3
	clock := &fakeClock{now: time.Unix(0, 0)}
	calls := 0
	boom := errors.New("503")
	attempts, err := p.Do(context.Background(), clock, func(context.Context, int) error { calls++; return boom })
	require.Equal(t, 3, attempts)
	require.Equal(t, 3, calls)
	var exhausted *steps.ExhaustedError
	require.ErrorAs(t, err, &exhausted)
	require.ErrorIs(t, err, boom)
	require.Equal(t, steps.ClassRetryable, steps.Classify(err), "exhaustion keeps the last error's class")
	require.Len(t, clock.sleeps, 2)
}

func TestPolicyStopsBeforeExceedingMaxElapsed(t *testing.T) {
	t.Parallel()
	p := noJitter
	p.MaxElapsed = time.Second // waits 100, 200, 400ms fit; the next 800ms would not
	clock := &fakeClock{now: time.Unix(0, 0)}
	attempts, err := p.Do(context.Background(), clock, func(context.Context, int) error { return errors.New("x") })
	require.Equal(t, 4, attempts)
	require.ErrorAs(t, err, new(*steps.ExhaustedError))
	require.Equal(t, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}, clock.sleeps)
}

func TestPolicyDoesNotRetryPermanentErrors(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: time.Unix(0, 0)}
	declined := steps.Permanent("card_declined", errors.New("declined"))
	attempts, err := noJitter.Do(context.Background(), clock, func(context.Context, int) error { return declined })
	require.Equal(t, 1, attempts)
	require.Equal(t, declined, err)
	require.Empty(t, clock.sleeps)
}

func TestPolicyStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	attempts, err := noJitter.Do(ctx, &fakeClock{}, func(context.Context, int) error {
		cancel()
		return errors.New("x")
	})
	require.Equal(t, 1, attempts)
	require.ErrorIs(t, err, context.Canceled)
}

func TestPolicyDoWithTheSystemClockWaits(t *testing.T) {
	t.Parallel()
	p := steps.Policy{InitialInterval: 5 * time.Millisecond, Jitter: -1, MaxAttempts: 3}
	start := time.Now()
	attempts, err := p.Do(context.Background(), nil, func(context.Context, int) error { return errors.New("x") })
	require.Equal(t, 3, attempts)
	require.Error(t, err)
	require.GreaterOrEqual(t, time.Since(start), 15*time.Millisecond, "5ms then 10ms")
}

func TestPolicyValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, steps.Policy{}.Validate())
	require.Error(t, steps.Policy{Multiplier: 0.5}.Validate())
	require.Error(t, steps.Policy{MaxAttempts: -1}.Validate())
	require.Error(t, steps.Policy{InitialInterval: -time.Second}.Validate())
	require.Error(t, steps.Policy{Jitter: 1}.Validate())
}

func TestClassify(t *testing.T) {
	t.Parallel()
	status := func(code int) error { return &steps.StatusError{StatusCode: code} }
	for _, tc := range []struct {
		err  error
		want steps.Class
	}{
		{steps.Permanent("card_declined", nil), steps.ClassPermanent},
		{status(400), steps.ClassPermanent},
		{status(402), steps.ClassPermanent},
		{status(404), steps.ClassPermanent},
		{status(422), steps.ClassPermanent},
		{status(408), steps.ClassRetryable},
		{status(409), steps.ClassRetryable},
		{status(429), steps.ClassRetryable},
		{status(500), steps.ClassRetryable},
		{status(503), steps.ClassRetryable},
		{&steps.IndeterminateError{Err: errors.New("EOF")}, steps.ClassIndeterminate},
		{context.DeadlineExceeded, steps.ClassIndeterminate},
		{errors.New("connection refused"), steps.ClassRetryable},
	} {
		require.Equal(t, tc.want, steps.Classify(tc.err), "%v", tc.err)
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	require.Equal(t, 120*time.Second, steps.ParseRetryAfter("120", now))
	require.Equal(t, 30*time.Second, steps.ParseRetryAfter(now.Add(30*time.Second).Format(http.TimeFormat), now))
	require.Zero(t, steps.ParseRetryAfter("", now))
	require.Zero(t, steps.ParseRetryAfter("-5", now))
	require.Zero(t, steps.ParseRetryAfter("soon", now))
	require.Zero(t, steps.ParseRetryAfter(now.Add(-time.Minute).Format(http.TimeFormat), now))
}
