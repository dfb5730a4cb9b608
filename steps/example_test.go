package steps_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/ratchet-run/ratchet/steps"
)

// A step's child key is a pure function of the run and the phase: every
// retry, in every process, sends the same one.
func ExampleChildKey() {
	key := steps.ChildKey("default", "01JD3M5ZQ6V1YQ2W3E4R5T6Y7U", "charge_created")
	fmt.Println(key)
	fmt.Println(key.Nth(1)) // the second call of the same step
	// Output:
	// rk1_zx34ejctq23fa3zbukvmdgv3xvxapfor
	// rk1_plmuhy6fnnxjnl3oxxxob657sbdt5uo7
}

// A key of the second format names its run, which Run reads back: the run
// behind a key downstream reports is found by its id.
func ExampleChildKeyV2() {
	key, err := steps.ChildKeyV2("default", "01JD3M5ZQ6V1YQ2W3E4R5T6Y7Z", "charge_created")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(key)
	fmt.Println(key.Run())
	fmt.Println(key.Nth(1).Run()) // the second call of the step names the same run
	_, err = steps.ChildKeyV2("default", "run-1", "charge_created")
	fmt.Println(err)
	// Output:
	// rk2_01jd3m5zq6v1yq2w3e4r5t6y7z_tdf3rbyr2srlte6iex6v7oi2
	// 01JD3M5ZQ6V1YQ2W3E4R5T6Y7Z true
	// 01JD3M5ZQ6V1YQ2W3E4R5T6Y7Z true
	// steps: run id "run-1" is not a canonical ULID
}

// A key of the third format names the request (the tenant and its
// idempotency key), so every run made for that request sends the same
// key; Digest reads back the request's digest, by which its run is found.
func ExampleChildKeyV3() {
	key := steps.ChildKeyV3("default", "order-42", "charge_created")
	fmt.Println(key)
	d, ok := key.Digest()
	fmt.Println(bytes.Equal(d, steps.RequestDigest("default", "order-42")), ok)
	d, ok = key.Nth(1).Digest() // the second call of the step: the same request
	fmt.Println(bytes.Equal(d, steps.RequestDigest("default", "order-42")), ok)
	fmt.Println(key == steps.ChildKeyV3("acme", "order-42", "charge_created")) // another tenant's request
	// Output:
	// rk3_xyzb6apn3d5n5xi4evlbogsdvi_epycv6ttpejtgl55qh4vdski
	// true true
	// true true
	// false
}

// Classify says what a failed call means for retrying it.
func ExampleClassify() {
	for _, err := range []error{
		&steps.StatusError{StatusCode: http.StatusServiceUnavailable},
		&steps.StatusError{StatusCode: http.StatusTooManyRequests, RetryAfter: 2 * time.Second},
		&steps.StatusError{StatusCode: http.StatusPaymentRequired},
		&steps.IndeterminateError{Err: errors.New("connection reset after the request was sent")},
		context.DeadlineExceeded,
	} {
		fmt.Printf("%v: %s\n", err, steps.Classify(err))
	}
	// Output:
	// downstream answered 503 Service Unavailable: retryable
	// downstream answered 429 Too Many Requests: retryable
	// downstream answered 402 Payment Required: permanent
	// request sent, no answer (it may have happened): connection reset after the request was sent: indeterminate
	// context deadline exceeded: indeterminate
}

// A policy's waits, without jitter.
func ExamplePolicy_Delay() {
	p := steps.Policy{InitialInterval: 100 * time.Millisecond, MaxInterval: time.Second, Jitter: -1}
	for attempt := 1; attempt <= 5; attempt++ {
		fmt.Println(p.Delay(attempt, errors.New("503")))
	}
	// Output:
	// 100ms
	// 200ms
	// 400ms
	// 800ms
	// 1s
}
