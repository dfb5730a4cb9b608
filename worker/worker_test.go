package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/worker"
)

// startWorker runs an in-process worker with workflows until the test ends.
func startWorker(t *testing.T, b *testBundle, workflows *engine.Workflows, cfg *worker.Config) *worker.Worker {
	t.Helper()
	if cfg == nil {
		cfg = &worker.Config{}
	}
	cfg.Engine.Workflows = workflows
	cfg.FetchPollInterval = 20 * time.Millisecond
	w, err := worker.New(b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	return w
}

func TestRetryableFailureIsRetriedAtNextAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	executions := 0
	_, err := engine.Register(workflows, "flaky", func(ctx context.Context, _ struct{}) (string, error) {
		executions++
		if executions == 1 {
			return "", errors.New("downstream unavailable")
		}
		return engine.Atomic(ctx, "done", func(context.Context, pgx.Tx) (string, error) { return "ok", nil })
	}, nil)
	require.NoError(t, err)
	const backoff = 700 * time.Millisecond
	w := startWorker(t, b, workflows, &worker.Config{Engine: engine.Config{RetryBackoff: func(int) time.Duration { return backoff }}})

	res, err := w.Engine().Start(context.Background(), engine.StartParams{Workflow: "flaky", IdempotencyKey: "f1", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, res.Run.Status)
	nextAttempt := *res.Run.NextAttemptAt

	b.awaitFinished(t, 30*time.Second, "f1")
	run, err := w.Engine().Run(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	require.Equal(t, 2, executions)
	require.False(t, run.FinishedAt.Before(nextAttempt), "retried no earlier than next_attempt_at")
	require.Less(t, run.FinishedAt.Sub(nextAttempt), 2*time.Second, "and promptly after it")
}

func TestSweepSchedulesRunsThatHaveNoLook(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "noop", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "one", func(context.Context, pgx.Tx) (int, error) { return 1, nil })
	}, nil)
	require.NoError(t, err)

	// A client without a scheduler (no worker in its process) leaves runs
	// that nothing will look at.
	bare, err := engine.NewClient(b.pool, &engine.Config{Workflows: workflows})
	require.NoError(t, err)
	tx, err := b.pool.Begin(context.Background())
	require.NoError(t, err)
	_, err = bare.StartTx(context.Background(), tx, engine.StartParams{Workflow: "noop", IdempotencyKey: "orphan", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(context.Background()))

	w, err := worker.New(b.pool, &worker.Config{Engine: engine.Config{Workflows: workflows}})
	require.NoError(t, err)
	n, err := w.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = w.Sweep(context.Background())
	require.NoError(t, err)
	require.Zero(t, n, "a run with a scheduled look is left alone")

	startWorker(t, b, workflows, nil)
	b.awaitFinished(t, 30*time.Second, "orphan")
}

func TestInsertOnlyWorkerSchedulesButWorksNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "noop", func(ctx context.Context, _ struct{}) (int, error) { return 1, nil }, nil)
	require.NoError(t, err)
	w := startWorker(t, b, workflows, &worker.Config{InsertOnly: true})

	tx, err := b.pool.Begin(context.Background())
	require.NoError(t, err)
	res, err := w.Engine().StartTx(context.Background(), tx, engine.StartParams{Workflow: "noop", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(context.Background()))

	var jobs int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM ratchet.river_job WHERE kind = 'ratchet.resume' AND args->>'run_id' = $1 AND state = 'available'`, res.Run.ID).Scan(&jobs))
	require.Equal(t, 1, jobs, "the claim scheduled a look, which waits for a worker")
}

func TestConfigIsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := worker.New(b.pool, &worker.Config{})
	require.ErrorContains(t, err, "Workflows is required")
	_, err = worker.New(b.pool, &worker.Config{Engine: engine.Config{Workflows: engine.NewWorkflows()}, FetchPollInterval: time.Microsecond})
	require.ErrorContains(t, err, "FetchPollInterval")
}
