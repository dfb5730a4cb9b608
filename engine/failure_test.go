package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
)

var errDeclined = errors.New("card declined")

// registerFailing registers a workflow whose single phase writes a counter
// and then fails with whatever fail returns.
func registerFailing(t *testing.T, fail func() error) *engine.Workflows {
	t.Helper()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "failing", func(ctx context.Context, _ struct{}) (struct{}, error) {
		return engine.Atomic(ctx, "half_done", func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			if _, err := bump(ctx, tx, "partial"); err != nil {
				return struct{}{}, err
			}
			return struct{}{}, fail()
		}, nil)
	}, nil)
	require.NoError(t, err)
	return workflows
}

func start(t *testing.T, c *engine.Client, workflow, key string) *engine.StartResult {
	t.Helper()
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: workflow, IdempotencyKey: key, Input: []byte(`{}`)})
	require.NoError(t, err)
	return res
}

func TestFailedAtomicPhaseLeavesNoPartialWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, registerFailing(t, func() error { return errors.New("boom") }), nil)

	res := start(t, c, "failing", "k")
	require.Equal(t, 0, b.counter(t, "partial"), "the phase's writes rolled back")
	require.Equal(t, "started", res.Run.RecoveryPoint, "the recovery point did not move")
	require.Equal(t, 0, b.countRows(t, "phases"))
}

func TestPermanentErrorFailsRunAndIsReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	calls := 0
	c := b.client(t, registerFailing(t, func() error {
		calls++
		return steps.Permanent("card_declined", errDeclined)
	}), nil)

	res := start(t, c, "failing", "k")
	run := res.Run
	require.Equal(t, engine.StatusFailed, run.Status)
	require.Equal(t, &engine.RunError{Code: "card_declined", Message: "card declined"}, run.Error)
	require.NotNil(t, run.FinishedAt)
	require.Nil(t, run.LeaseExpiresAt)

	again := start(t, c, "failing", "k")
	require.Equal(t, engine.OutcomeFinished, again.Outcome)
	require.Equal(t, run.Error, again.Run.Error, "the stored failure is replayed")
	require.Equal(t, 1, calls, "the workflow did not run again")
}

func TestRetryableErrorLeavesRunUnfinishedWithBackoff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const backoff = time.Hour
	c := b.client(t, registerFailing(t, func() error { return errors.New("gateway timeout") }),
		&engine.Config{Retry: constantRetry(backoff)})

	res := start(t, c, "failing", "k")
	run := res.Run
	require.Equal(t, engine.StatusPending, run.Status, "unfinished, not failed")
	require.Nil(t, run.FinishedAt)
	require.Nil(t, run.LeaseExpiresAt, "the lease is released for the retry")
	require.Equal(t, &engine.RunError{Code: engine.CodeInternal, Message: "gateway timeout", Retryable: true}, run.Error)
	require.Equal(t, "started", run.RecoveryPoint)

	var inFuture bool
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT next_attempt_at > now() + interval '59 minutes' FROM ratchet.runs WHERE id = $1`, run.ID).Scan(&inFuture))
	require.True(t, inFuture, "next_attempt_at is set by the backoff")

	again := start(t, c, "failing", "k")
	require.Equal(t, engine.OutcomeResumable, again.Outcome)
}

func TestPanickingWorkflowIsRetryable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "panicky", func(ctx context.Context, _ struct{}) (struct{}, error) {
		panic("nil map")
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)

	run := start(t, c, "panicky", "k").Run
	require.Equal(t, engine.StatusPending, run.Status)
	require.Equal(t, engine.CodePanic, run.Error.Code)
	require.True(t, run.Error.Retryable)
}

func TestDuplicatePhaseNameFailsRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "dup", func(ctx context.Context, _ struct{}) (struct{}, error) {
		noop := func(context.Context, pgx.Tx) (int, error) { return 1, nil }
		if _, err := engine.Atomic(ctx, "same", noop, nil); err != nil {
			return struct{}{}, err
		}
		_, err := engine.Atomic(ctx, "same", noop, nil)
		return struct{}{}, err
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)

	run := start(t, c, "dup", "k").Run
	require.Equal(t, engine.StatusFailed, run.Status)
	require.Equal(t, engine.CodeDuplicatePhase, run.Error.Code)
}

func TestAtomicOutsideRunIsAnError(t *testing.T) {
	t.Parallel()
	_, err := engine.Atomic(context.Background(), "p", func(context.Context, pgx.Tx) (int, error) { return 0, nil }, nil)
	require.ErrorIs(t, err, engine.ErrNotInRun)
}
