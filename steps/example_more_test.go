package steps_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ratchet-run/ratchet/steps"
)

// The transport sends the key a step's context carries (the engine puts
// it there) as Idempotency-Key; a client of its own reads it with KeyFrom.
func ExampleNewTransport() {
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.Header.Get(steps.HeaderIdempotencyKey))
	}))
	defer server.Close()
	client := &http.Client{Transport: steps.NewTransport(&steps.TransportOpts{Base: http.DefaultTransport})}

	key := steps.ChildKey("acme", "01JD7Q4YB3M6N5P8R9S0T1V2W3", "charge_created")
	ctx := steps.WithKey(context.Background(), key)
	got, _ := steps.KeyFrom(ctx)
	fmt.Println(got == key)

	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, server.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body := make([]byte, steps.KeyLen)
	n, _ := resp.Body.Read(body)
	fmt.Println(string(body[:n]) == string(key), n)
	// Output:
	// true
	// true 36
}

// What each failure means for a retry, and the errors that say so.
func ExamplePermanentError() {
	declined := steps.Permanent("card_declined", errors.New("your card was declined"))
	var perm *steps.PermanentError
	fmt.Println(errors.As(declined, &perm), perm.Code, perm)

	later := steps.RetryAfter(time.Hour, errors.New("rate limited"))
	var ra *steps.RetryAfterError
	fmt.Println(errors.As(later, &ra), ra.Delay, steps.Classify(later), errors.Unwrap(later))

	sent := &steps.IndeterminateError{Err: errors.New("connection reset")}
	fmt.Println(steps.Classify(sent), errors.Unwrap(sent))

	status := &steps.StatusError{StatusCode: http.StatusTooManyRequests, RetryAfter: 2 * time.Second}
	fmt.Println(status, steps.Classify(status))
	// Output:
	// true card_declined card_declined: your card was declined
	// true 1h0m0s retryable rate limited
	// indeterminate connection reset
	// downstream answered 429 Too Many Requests retryable
}

// instant is a Clock that sleeps without waiting, as tests use.
type instant struct{ now time.Time }

func (c *instant) Now() time.Time { return c.now }
func (c *instant) Sleep(_ context.Context, d time.Duration) error {
	c.now = c.now.Add(d)
	return nil
}

// Do retries a call by the policy: here one that fails twice, then one that
// never succeeds and exhausts it.
func ExamplePolicy_Do() {
	p := steps.Policy{InitialInterval: time.Second, MaxAttempts: 3, Jitter: -1}
	if err := p.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(p.WithDefaults().MaxInterval)

	var clock steps.Clock = &instant{}
	attempts, err := p.Do(context.Background(), clock, func(_ context.Context, attempt int) error {
		if attempt < 3 {
			return errors.New("502 from the gateway")
		}
		return nil
	})
	fmt.Println(attempts, err)

	attempts, err = p.Do(context.Background(), clock, func(context.Context, int) error { return errors.New("down") })
	var exhausted *steps.ExhaustedError
	fmt.Println(attempts, errors.As(err, &exhausted), exhausted.Attempts, errors.Unwrap(err))

	// The real clock, for a call outside the engine.
	var real steps.SystemClock
	attempts, err = steps.Policy{MaxAttempts: 1}.Do(context.Background(), real, func(context.Context, int) error { return nil })
	fmt.Println(attempts, err, !real.Now().IsZero(), real.Sleep(context.Background(), time.Millisecond))

	fmt.Println(steps.Policy{InitialInterval: time.Millisecond}.Validate() == nil, steps.Policy{Multiplier: 0.5}.Validate() != nil)
	// Output:
	// 10s
	// 3 <nil>
	// 3 true 3 down
	// 1 <nil> true <nil>
	// true true
}

// A downstream's Retry-After, in either form, as a wait.
func ExampleParseRetryAfter() {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	fmt.Println(steps.ParseRetryAfter("120", now))
	fmt.Println(steps.ParseRetryAfter("Thu, 03 Dec 2026 12:05:00 GMT", now))
	fmt.Println(steps.ParseRetryAfter("soon", now))
	// Output:
	// 2m0s
	// 5m0s
	// 0s
}
