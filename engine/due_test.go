package engine_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
)

// startUnleased creates a pending, unleased run with StartTx, as a service
// does in its own transaction.
func startUnleased(t *testing.T, b *testBundle, c *engine.Client, workflow, key string) *engine.Run {
	t.Helper()
	ctx := context.Background()
	var run *engine.Run
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		res, err := c.StartTx(ctx, tx, engine.StartParams{Workflow: workflow, IdempotencyKey: key, Input: []byte(`{}`)})
		if err == nil {
			run = res.Run
		}
		return err
	}))
	return run
}

func runIDs(runs []*engine.Run) []string {
	ids := make([]string, len(runs))
	for i, r := range runs {
		ids[i] = r.ID
	}
	slices.Sort(ids)
	return ids
}

func TestClaimDueTakesOverExactlyTheRunsThatAreDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	failOnce := map[string]bool{}
	var mu sync.Mutex
	_, err := engine.Register(workflows, "flaky", func(ctx context.Context, in struct {
		Key     string
		Backoff time.Duration
	}) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if !failOnce[in.Key] {
			failOnce[in.Key] = true
			return 0, steps.RetryAfter(in.Backoff, errors.New("downstream unavailable"))
		}
		return 1, nil
	}, nil)
	require.NoError(t, err)
	_, err = engine.Register(workflows, "noop", func(context.Context, struct{}) (int, error) { return 1, nil }, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)

	pending := startUnleased(t, b, c, "noop", "pending")
	claimed, err := c.Claim(ctx, engine.StartParams{Workflow: "noop", IdempotencyKey: "live", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, claimed.Run.LeaseExpiresAt, claimed.Run.DueAt, "a leased run is due when its lease expires")
	expired, err := c.Claim(ctx, engine.StartParams{Workflow: "noop", IdempotencyKey: "expired", Input: []byte(`{}`)})
	require.NoError(t, err)
	b.expireLease(t, expired.Run.ID)
	finished, err := c.Start(ctx, engine.StartParams{Workflow: "noop", IdempotencyKey: "finished", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Nil(t, finished.Run.DueAt, "a finished run is never due")

	start := func(key string, backoff time.Duration) *engine.Run {
		res, err := c.Start(ctx, engine.StartParams{Workflow: "flaky", IdempotencyKey: key, Input: []byte(fmt.Sprintf(`{"Key": %q, "Backoff": %d}`, key, backoff))})
		require.NoError(t, err)
		require.Equal(t, engine.StatusPending, res.Run.Status)
		require.Equal(t, res.Run.NextAttemptAt, res.Run.DueAt, "a run backing off is due when the backoff ends")
		return res.Run
	}
	retryDue := start("retry-due", 0)
	start("retry-later", time.Hour)

	// A run of a workflow this client does not know is left to a process
	// that does.
	others := engine.NewWorkflows()
	_, err = engine.Register(others, "elsewhere", func(context.Context, struct{}) (int, error) { return 1, nil }, nil)
	require.NoError(t, err)
	startUnleased(t, b, b.client(t, others, nil), "elsewhere", "elsewhere")

	runs, err := c.ClaimDue(ctx, 100)
	require.NoError(t, err)
	require.Equal(t, runIDs([]*engine.Run{pending, expired.Run, retryDue}), runIDs(runs))
	for _, r := range runs {
		require.Equal(t, engine.StatusRunning, r.Status)
		require.Equal(t, c.ID(), *r.LeaseOwner)
		require.Nil(t, r.NextAttemptAt)
		require.Equal(t, r.LeaseExpiresAt, r.DueAt)
	}
	again, err := c.ClaimDue(ctx, 100)
	require.NoError(t, err)
	require.Empty(t, again, "claimed runs are leased, so no longer due")

	for _, r := range runs {
		final, err := c.Continue(ctx, r)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, final.Status, "run %s", r.IdempotencyKey)
	}
}

func TestClaimDueFromManyClientsClaimsEveryRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "noop", func(context.Context, struct{}) (int, error) { return 1, nil }, nil)
	require.NoError(t, err)
	const runs = 300
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		c := b.client(t, workflows, nil)
		for i := range runs {
			if _, err := c.StartTx(ctx, tx, engine.StartParams{Workflow: "noop", IdempotencyKey: fmt.Sprint(i), Input: []byte(`{}`)}); err != nil {
				return err
			}
		}
		return nil
	}))

	var (
		mu   sync.Mutex
		seen = map[string]int{}
		wg   sync.WaitGroup
	)
	for range 4 {
		c := b.client(t, workflows, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				claimed, err := c.ClaimDue(ctx, 7)
				if !assertNoError(t, err) || len(claimed) == 0 {
					return
				}
				mu.Lock()
				for _, r := range claimed {
					seen[r.ID]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Len(t, seen, runs)
	for id, n := range seen {
		require.Equal(t, 1, n, "run %s claimed %d times", id, n)
	}
}

func TestContinueExecutesFromTheRecoveryPoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	executions := 0
	_, err := engine.Register(workflows, "two", func(ctx context.Context, _ struct{}) (int, error) {
		executions++
		if _, err := engine.Atomic(ctx, "first", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "first") }, nil); err != nil {
			return 0, err
		}
		if executions == 1 {
			return 0, errors.New("fails once between the phases")
		}
		return engine.Atomic(ctx, "second", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "second") }, nil)
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{Retry: constantRetry(0)})
	res, err := c.Start(ctx, engine.StartParams{Workflow: "two", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, "first", res.Run.RecoveryPoint)

	runs, err := c.ClaimDue(ctx, 10)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	final, err := c.Continue(ctx, runs[0])
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, final.Status)
	require.Equal(t, 1, b.counter(t, "first"), "the committed phase replayed, not repeated")
	require.Equal(t, 1, b.counter(t, "second"))

	_, err = c.Continue(ctx, res.Run)
	require.ErrorContains(t, err, "claimed by this client", "only a run this client claimed")
}

func TestExecutionTimeoutReleasesTheRunToBeRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "slow", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "waits", func(ctx context.Context, _ pgx.Tx) (int, error) {
			<-ctx.Done()
			return 0, ctx.Err()
		}, nil)
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{Retry: constantRetry(time.Hour)})
	startUnleased(t, b, c, "slow", "k")
	runs, err := c.ClaimDue(ctx, 1)
	require.NoError(t, err)
	require.Len(t, runs, 1)

	limited, cancel := context.WithTimeoutCause(ctx, 100*time.Millisecond, engine.ErrExecutionTimeout)
	defer cancel()
	run, err := c.Continue(limited, runs[0])
	require.NoError(t, err, "the run was released, not abandoned")
	require.Equal(t, engine.StatusPending, run.Status)
	require.Nil(t, run.LeaseOwner)
	require.Equal(t, engine.CodeExecutionTimeout, run.Error.Code)
	require.True(t, run.Error.Retryable)
	require.Equal(t, run.NextAttemptAt, run.DueAt, "due again after the backoff")
}
