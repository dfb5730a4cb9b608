package worker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/worker"
)

type noticeArgs struct {
	RunID string `json:"run_id"`
}

func (noticeArgs) Kind() string { return "app.notice" }

type noticeWorker struct {
	river.WorkerDefaults[noticeArgs]
	delivered chan string
}

func (w *noticeWorker) Work(_ context.Context, job *river.Job[noticeArgs]) error {
	w.delivered <- job.Args.RunID
	return nil
}

// The outbox through the process's own River client: a job inserted in an
// atomic phase's transaction is staged iff the phase commits, and worked by
// the application's worker in the same process.
func TestTheWorkersRiverClientIsTheOutbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	var w *worker.Worker
	var failed atomic.Bool
	_, err := engine.Register(workflows, "notify", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "noticed", func(ctx context.Context, tx pgx.Tx) (int, error) {
			info, _ := engine.RunInfoFrom(ctx)
			if _, err := w.River().InsertTx(ctx, tx, noticeArgs{RunID: info.RunID}, &river.InsertOpts{Queue: "app"}); err != nil {
				return 0, err
			}
			if !failed.Swap(true) {
				return 0, context.DeadlineExceeded
			}
			return 1, nil
		}, nil)
	}, &engine.WorkflowOpts{Retry: &engine.RetryPolicy{InitialInterval: time.Millisecond}})
	require.NoError(t, err)
	workers := river.NewWorkers()
	notices := &noticeWorker{delivered: make(chan string, 10)}
	river.AddWorker(workers, notices)
	w = startWorker(t, b, workflows, &worker.Config{Workers: workers, Queues: map[string]river.QueueConfig{"app": {MaxWorkers: 1}}})

	res, err := w.Engine().Start(context.Background(), engine.StartParams{Workflow: "notify", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	b.awaitFinished(t, 30*time.Second, "k")
	select {
	case id := <-notices.delivered:
		require.Equal(t, res.Run.ID, id)
	case <-time.After(30 * time.Second):
		t.Fatal("the staged job was not worked")
	}
	var jobs int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM ratchet.river_job WHERE kind = 'app.notice'`).Scan(&jobs))
	require.Equal(t, 1, jobs, "one job: the rolled-back phase staged none")
}
