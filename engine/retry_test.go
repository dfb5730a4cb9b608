package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/steps"
)

// A workflow's retry policy bounds its executions and overrides the
// client's; the run then fails with a code of its own and the last error.
func TestRetryPolicyGivesUpWithItsOwnCode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	var executions atomic.Int32
	_, err := engine.Register(workflows, "flaky", func(context.Context, struct{}) (int, error) {
		executions.Add(1)
		return 0, errors.New("bank unavailable")
	}, &engine.WorkflowOpts{
		Retry:         &engine.RetryPolicy{InitialInterval: time.Nanosecond, MaxAttempts: 3},
		ErrorStatuses: map[string]int{engine.CodeRetriesExhausted: 503},
	})
	require.NoError(t, err)
	_, err = engine.Register(workflows, "default", func(context.Context, struct{}) (int, error) {
		return 0, errors.New("still unavailable")
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{Retry: engine.RetryPolicy{InitialInterval: time.Hour, MaxInterval: 2 * time.Hour}})

	res, err := c.Start(ctx, engine.StartParams{Workflow: "flaky", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	run := res.Run
	for run.Status == engine.StatusPending {
		require.Less(t, run.Attempt, 3)
		run, err = c.TakeOver(ctx, run.ID) // each due at once: the workflow's 1ns, not the client's hour
		require.NoError(t, err)
	}
	require.Equal(t, engine.StatusFailed, run.Status)
	require.Equal(t, 3, run.Attempt)
	require.EqualValues(t, 3, executions.Load())
	require.Equal(t, engine.CodeRetriesExhausted, run.Error.Code)
	require.Contains(t, run.Error.Message, "bank unavailable", "the last error is kept")
	require.Equal(t, 503, *run.ResponseStatus)

	// The client's policy applies to workflows without one.
	res, err = c.Start(ctx, engine.StartParams{Workflow: "default", IdempotencyKey: "d", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, res.Run.Status)
	wait := res.Run.NextAttemptAt.Sub(res.Run.UpdatedAt)
	require.InDelta(t, time.Hour.Seconds(), wait.Seconds(), (12 * time.Minute).Seconds(), "the client's hour, give or take its jitter")
}

func TestRetryPolicyMaxElapsedCountsFromTheRunsCreation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "slow-bank", func(context.Context, struct{}) (int, error) {
		return 0, errors.New("bank unavailable")
	}, &engine.WorkflowOpts{Retry: &engine.RetryPolicy{InitialInterval: time.Minute, MaxElapsed: 30 * time.Second}})
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: "slow-bank", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Run.Status, "a retry a minute away would begin past the 30s deadline")
	require.Equal(t, engine.CodeRetriesExhausted, res.Run.Error.Code)
}

// steps.RetryAfter: a workflow that knows when to try again says so, and
// the run is due then, whatever the backoff would have been.
func TestRetryAfterSetsTheNextAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "dunning", func(context.Context, struct{}) (int, error) {
		return 0, steps.RetryAfter(24*time.Hour, fmt.Errorf("card declined for insufficient funds"))
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: "dunning", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, res.Run.Status)
	require.Equal(t, engine.CodeInternal, res.Run.Error.Code)
	require.Contains(t, res.Run.Error.Message, "retry after 24h0m0s")
	require.Equal(t, 24*time.Hour, res.Run.NextAttemptAt.Sub(res.Run.UpdatedAt).Round(time.Second), "exactly, without jitter")
}

// registerCheckout registers "checkout" with the retry policy given: a
// charge refunded if the run compensates, a wait for the warehouse's
// "shipped" signal, then a receipt whose first mailFailures sends fail.
// The counters "charged", "refunded" and "mailed" record the effects.
func registerCheckout(t *testing.T, workflows *engine.Workflows, policy engine.RetryPolicy, mailFailures int32) {
	t.Helper()
	var mails atomic.Int32
	_, err := engine.Register(workflows, "checkout", func(ctx context.Context, _ struct{}) (int, error) {
		_, err := engine.Atomic(ctx, "charge", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "charged") },
			&engine.AtomicOpts[int]{Compensate: func(ctx context.Context, tx pgx.Tx, _ int) error {
				_, err := bump(ctx, tx, "refunded")
				return err
			}})
		if err != nil {
			return 0, err
		}
		if _, err := engine.Await[struct{}](ctx, "shipped", nil); err != nil {
			return 0, err
		}
		return engine.Atomic(ctx, "receipt", func(ctx context.Context, tx pgx.Tx) (int, error) {
			if mails.Add(1) <= mailFailures {
				return 0, errors.New("mail server unavailable")
			}
			return bump(ctx, tx, "mailed")
		}, nil)
	}, &engine.WorkflowOpts{Retry: &policy})
	require.NoError(t, err)
}

// A wake is an execution, not a failure: with MaxAttempts 3, a run that
// waited for "shipped" and then failed twice to mail its receipt is
// executed a third time after failing, and succeeds. (Counting wakes, it
// gave up at its third execution and refunded a shipped order.)
func TestWaitsSpendNoRetryAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	registerCheckout(t, workflows, engine.RetryPolicy{InitialInterval: time.Nanosecond, MaxAttempts: 3}, 2)
	c := b.client(t, workflows, nil)

	res, err := c.Start(ctx, engine.StartParams{Workflow: "checkout", IdempotencyKey: "order-1", Input: []byte(`{}`)})
	require.NoError(t, err)
	run := res.Run
	require.Equal(t, engine.StatusWaiting, run.Status)
	require.Equal(t, [2]int{1, 0}, [2]int{run.Attempt, run.Failures}, "attempt, failures")
	// Taken over early, it parks again: one more execution, no failure.
	run, err = c.TakeOver(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, run.Status)
	require.Equal(t, [2]int{2, 0}, [2]int{run.Attempt, run.Failures})

	_, err = c.Signal(ctx, engine.SignalParams{Name: "shipped", EventID: "evt-1", RunID: run.ID, Payload: []byte(`{}`)})
	require.NoError(t, err)
	for _, failures := range []int{1, 2} {
		run, err = c.TakeOver(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, engine.StatusPending, run.Status, "the receipt failed: %+v", run.Error)
		require.Equal(t, failures, run.Failures)
	}
	run, err = c.TakeOver(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status, "%+v", run.Error)
	require.Equal(t, [2]int{5, 2}, [2]int{run.Attempt, run.Failures})
	require.Equal(t, 1, b.counter(t, "mailed"))
	require.Equal(t, 0, b.counter(t, "refunded"), "a shipped order is not refunded")

	// The third failure spends the policy: the run compensates, and says
	// how many executions failed.
	workflows = engine.NewWorkflows()
	registerCheckout(t, workflows, engine.RetryPolicy{InitialInterval: time.Nanosecond, MaxAttempts: 3}, 3)
	c = b.client(t, workflows, nil)
	res, err = c.Start(ctx, engine.StartParams{Workflow: "checkout", IdempotencyKey: "order-2", Input: []byte(`{}`)})
	require.NoError(t, err)
	_, err = c.Signal(ctx, engine.SignalParams{Name: "shipped", EventID: "evt-2", RunID: res.Run.ID, Payload: []byte(`{}`)})
	require.NoError(t, err)
	run = res.Run
	for range 3 {
		run, err = c.TakeOver(ctx, run.ID)
		require.NoError(t, err)
	}
	require.Equal(t, engine.StatusCompensated, run.Status)
	require.Equal(t, engine.CodeRetriesExhausted, run.Error.Code)
	require.Contains(t, run.Error.Message, "gave up after 3 failed executions; the last failed with")
	require.Equal(t, [2]int{4, 3}, [2]int{run.Attempt, run.Failures})
	require.Equal(t, 1, b.counter(t, "refunded"))
}

// An execution lost to a crash is a failure: MaxAttempts bounds a run
// whose executor dies every time, which retrying would otherwise repeat
// for ever. The run replays its journal (registering its undos), runs
// nothing new and compensates.
func TestLostExecutionsSpendRetryAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	var posts atomic.Int32
	_, err := engine.Register(workflows, "crashy", func(ctx context.Context, _ struct{}) (int, error) {
		for _, name := range []string{"charge", "post", "done"} {
			_, err := engine.Atomic(ctx, name, func(ctx context.Context, tx pgx.Tx) (int, error) {
				if name == "done" {
					posts.Add(1)
				}
				return bump(ctx, tx, name)
			}, &engine.AtomicOpts[int]{Compensate: func(ctx context.Context, tx pgx.Tx, _ int) error {
				_, err := bump(ctx, tx, "undo "+name)
				return err
			}})
			if err != nil {
				return 0, err
			}
		}
		return 0, nil
	}, &engine.WorkflowOpts{Retry: &engine.RetryPolicy{InitialInterval: time.Nanosecond, MaxAttempts: 2}})
	require.NoError(t, err)
	c := b.client(t, workflows, nil)

	_, err = c.Start(enginetest.CrashAfter(ctx, "charge"), engine.StartParams{Workflow: "crashy", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	id := b.runIDForKey(t, "k")
	b.expireLease(t, id)
	_, err = c.TakeOver(enginetest.CrashAfter(ctx, "post"), id)
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	b.expireLease(t, id)
	run, err := c.TakeOver(ctx, id)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompensated, run.Status)
	require.Equal(t, engine.CodeRetriesExhausted, run.Error.Code)
	require.Equal(t, "engine: gave up after 2 failed executions; the last was lost (its lease expired: a crash or a lost connection)", run.Error.Message)
	require.Equal(t, [2]int{3, 2}, [2]int{run.Attempt, run.Failures})
	require.Zero(t, posts.Load(), "nothing new ran")
	require.Equal(t, 1, b.counter(t, "undo charge"))
	require.Equal(t, 1, b.counter(t, "undo post"))
}
