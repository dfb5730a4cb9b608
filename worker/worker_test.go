package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/recovery"
	"github.com/ratchet-run/ratchet/worker"
)

// startWorker runs an in-process worker with workflows until the test ends.
func startWorker(t *testing.T, b *testBundle, workflows *engine.Workflows, cfg *worker.Config) *worker.Worker {
	t.Helper()
	if cfg == nil {
		cfg = &worker.Config{}
	}
	cfg.Engine.Workflows = workflows
	cfg.Recovery.PollInterval = 20 * time.Millisecond
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
		return engine.Atomic(ctx, "done", func(context.Context, pgx.Tx) (string, error) { return "ok", nil }, nil)
	}, nil)
	require.NoError(t, err)
	const backoff = 700 * time.Millisecond
	w := startWorker(t, b, workflows, &worker.Config{Engine: engine.Config{Retry: engine.RetryPolicy{InitialInterval: backoff, Multiplier: 1, Jitter: -1}}})

	res, err := w.Engine().Start(context.Background(), engine.StartParams{Workflow: "flaky", IdempotencyKey: "f1", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, res.Run.Status)
	nextAttempt := *res.Run.NextAttemptAt

	b.awaitFinished(t, 30*time.Second, "f1")
	run, err := w.Engine().GetRun(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	require.Equal(t, 2, executions)
	require.False(t, run.FinishedAt.Before(nextAttempt), "retried no earlier than next_attempt_at")
	// Promptly after it: at a poll (every 500 ms), not after the 30 s a
	// lease would take to expire; 10 s leaves a loaded machine room.
	require.Less(t, run.FinishedAt.Sub(nextAttempt), 10*time.Second, "and promptly after it")
}

func TestRunsOfAClientWithoutAWorkerAreFoundAndFinished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "noop", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "one", func(context.Context, pgx.Tx) (int, error) { return 1, nil }, nil)
	}, nil)
	require.NoError(t, err)

	// A bare engine client, in a process with no worker: its runs are
	// found from the runs table alone.
	bare, err := engine.NewClient(b.pool, &engine.Config{Workflows: workflows})
	require.NoError(t, err)
	tx, err := b.pool.Begin(context.Background())
	require.NoError(t, err)
	_, err = bare.StartTx(context.Background(), tx, engine.StartParams{Workflow: "noop", IdempotencyKey: "orphan", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(context.Background()))

	startWorker(t, b, workflows, nil)
	b.awaitFinished(t, 30*time.Second, "orphan")
}

func TestNoRiverJobIsInsertedForARun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "noop", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "one", func(context.Context, pgx.Tx) (int, error) { return 1, nil }, nil)
	}, nil)
	require.NoError(t, err)
	w := startWorker(t, b, workflows, nil)
	ctx := context.Background()

	for _, key := range []string{"a", "b", "c"} {
		res, err := w.Engine().Start(ctx, engine.StartParams{Workflow: "noop", IdempotencyKey: key, Input: []byte(`{}`)})
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, res.Run.Status)
	}
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := w.Engine().StartTx(ctx, tx, engine.StartParams{Workflow: "noop", IdempotencyKey: "later", Input: []byte(`{}`)})
		return err
	}))
	var jobs int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.river_job WHERE kind <> $1`, worker.KindPrune).Scan(&jobs))
	require.Zero(t, jobs, "runs cost no River job, inline or created unleased")
	b.awaitFinished(t, 30*time.Second, "later")
}

func TestConfigIsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := worker.New(b.pool, &worker.Config{})
	require.ErrorContains(t, err, "Workflows is required")
	workflows := engine.NewWorkflows()
	for _, tc := range []struct {
		cfg  worker.Config
		want string
	}{
		{worker.Config{FetchPollInterval: time.Microsecond}, "FetchPollInterval"},
		{worker.Config{Recovery: recovery.Config{PollInterval: time.Hour}}, "PollInterval"},
		{worker.Config{JobTimeout: time.Minute, RescueStuckJobsAfter: time.Second}, "RescueStuckJobsAfter"},
	} {
		tc.cfg.Engine.Workflows = workflows
		_, err = worker.New(b.pool, &tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
}

func TestStopKeepsToItsContextAndSaysWhatDidNotStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	inRun := make(chan struct{}, 1)
	_, err := engine.Register(workflows, "deaf", func(ctx context.Context, _ struct{}) (int, error) {
		inRun <- struct{}{}
		<-stuck // ignores its context
		return 0, ctx.Err()
	}, nil)
	require.NoError(t, err)
	w, err := worker.New(b.pool, &worker.Config{Engine: engine.Config{Workflows: workflows}, ShutdownGrace: time.Minute})
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	go w.Engine().Start(context.Background(), engine.StartParams{Workflow: "deaf", IdempotencyKey: "k", Input: []byte(`{}`)}) //nolint:errcheck
	<-inRun

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	began := time.Now()
	err = w.Stop(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "not nil: an execution did not stop")
	require.Less(t, time.Since(began), 15*time.Second, "the context's 500ms and the hand-over, not the minute's grace")
}

func TestConnectionsCountsEveryHolder(t *testing.T) {
	t.Parallel()
	defaults := &worker.Config{}
	// 20 resumed executions, 5 for heartbeats, the poll, River's three and
	// Ratchet's queue.
	require.Equal(t, 20+5+1+3+1, defaults.Connections())
	busy := &worker.Config{
		Engine:   engine.Config{MaxInline: 40},
		Recovery: recovery.Config{MaxExecutions: 8},
		Queues:   map[string]river.QueueConfig{"a": {MaxWorkers: 4}, "b": {MaxWorkers: 6}},
	}
	require.Equal(t, 48+12+1+3+1+10, busy.Connections())
	apiOnly := &worker.Config{Engine: engine.Config{MaxInline: 4}, InsertOnly: true}
	require.Equal(t, 4+2, apiOnly.Connections(), "inline executions and their heartbeats alone")
}
