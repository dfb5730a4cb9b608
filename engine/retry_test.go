package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
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
