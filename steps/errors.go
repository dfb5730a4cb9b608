package steps

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Class is what a failed call means for retrying it.
type Class int

const (
	// Retryable: the call did not happen, or failed in a way that may pass
	// (a 5xx, a 429, a refused connection). Retry with the same key.
	ClassRetryable Class = iota
	// Indeterminate: the request was sent and no answer came back (a
	// timeout, a dropped connection). It may have happened. Retry with the
	// same key, so that the downstream answers for the original; never
	// treat it as not having happened.
	ClassIndeterminate
	// Permanent: retrying cannot change the answer (a declined card, a 4xx
	// other than 408, 409 and 429).
	ClassPermanent
)

func (c Class) String() string {
	switch c {
	case ClassRetryable:
		return "retryable"
	case ClassIndeterminate:
		return "indeterminate"
	case ClassPermanent:
		return "permanent"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// PermanentError marks an error that retrying cannot fix. A workflow that
// returns one fails its run; the error is stored and replayed to later
// callers with the same key.
type PermanentError struct {
	// Code is a short stable identifier, e.g. "card_declined".
	Code string
	Err  error
}

// Permanent wraps err as a PermanentError with the given code. An empty code
// becomes "permanent".
func Permanent(code string, err error) error {
	if code == "" {
		code = "permanent"
	}
	return &PermanentError{Code: code, Err: err}
}

func (e *PermanentError) Error() string {
	if e.Err == nil {
		return e.Code
	}
	return e.Code + ": " + e.Err.Error()
}

func (e *PermanentError) Unwrap() error { return e.Err }

// StatusError is a downstream's answer with a status other than 2xx.
type StatusError struct {
	StatusCode int
	// RetryAfter is the downstream's Retry-After, or 0.
	RetryAfter time.Duration
	// Body is the start of the response body (at most 4 KiB).
	Body []byte
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("downstream answered %d %s", e.StatusCode, http.StatusText(e.StatusCode))
}

// IndeterminateError wraps a failure that came after the request was sent.
type IndeterminateError struct{ Err error }

func (e *IndeterminateError) Error() string {
	return "request sent, no answer (it may have happened): " + e.Err.Error()
}

func (e *IndeterminateError) Unwrap() error { return e.Err }

// ExhaustedError reports that a policy gave up on a call that never
// succeeded nor failed permanently. It classifies as its last error does:
// the step may still succeed later, with the same key.
type ExhaustedError struct {
	Attempts int
	Elapsed  time.Duration
	Last     error
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("gave up after %d attempts in %s: %v", e.Attempts, e.Elapsed.Round(time.Millisecond), e.Last)
}

func (e *ExhaustedError) Unwrap() error { return e.Last }

// Classify says what err means for retrying: a PermanentError or a 4xx
// StatusError (but 408 Request Timeout, 409 Conflict and 429 Too Many
// Requests) is Permanent; an IndeterminateError or an expired deadline (a
// step's timeout) is Indeterminate; everything else, 5xx included, is
// Retryable.
func Classify(err error) Class {
	var (
		perm   *PermanentError
		status *StatusError
		indet  *IndeterminateError
	)
	switch {
	case errors.As(err, &perm):
		return ClassPermanent
	case errors.As(err, &status):
		switch s := status.StatusCode; {
		case s == http.StatusRequestTimeout, s == http.StatusConflict, s == http.StatusTooManyRequests:
			return ClassRetryable
		case s >= 400 && s < 500:
			return ClassPermanent
		}
		return ClassRetryable
	case errors.As(err, &indet), errors.Is(err, context.DeadlineExceeded):
		return ClassIndeterminate
	}
	return ClassRetryable
}

// RetryAfterError asks for the next attempt no earlier than Delay from
// now: a retry policy waits exactly that long instead of its backoff.
type RetryAfterError struct {
	Delay time.Duration
	Err   error
}

// RetryAfter wraps err to say when to try again: a step's policy waits d
// before its next attempt, and a workflow that returns it is executed again
// after d (a card to retry tomorrow, a downstream that named its hour).
// The error stays retryable; a run's policy may still give up first.
func RetryAfter(d time.Duration, err error) error {
	return &RetryAfterError{Delay: max(d, 0), Err: err}
}

func (e *RetryAfterError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("retry after %s", e.Delay)
	}
	return fmt.Sprintf("%v (retry after %s)", e.Err, e.Delay)
}

func (e *RetryAfterError) Unwrap() error { return e.Err }

// retryAfter returns the wait err asks for: a RetryAfterError's, else a
// downstream's Retry-After.
func retryAfter(err error) time.Duration {
	var (
		ra     *RetryAfterError
		status *StatusError
	)
	switch {
	case errors.As(err, &ra):
		return max(ra.Delay, 1) // a zero delay is "now", not "no opinion"
	case errors.As(err, &status):
		return status.RetryAfter
	}
	return 0
}
