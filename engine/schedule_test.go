package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
)

// tableScheduler records schedules in a table, in the claiming transaction.
type tableScheduler struct{}

func (tableScheduler) ScheduleTx(ctx context.Context, tx pgx.Tx, s engine.Schedule) error {
	_, err := tx.Exec(ctx, `INSERT INTO schedules (run_id, token, at) VALUES ($1, $2, $3)`, s.RunID, s.LeaseToken, s.At)
	return err
}

type scheduled struct {
	Token int64
	At    time.Time
}

func (b *testBundle) schedules(t *testing.T, runID string) []scheduled {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT token, at FROM schedules WHERE run_id = $1 ORDER BY id`, runID)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[scheduled])
	require.NoError(t, err)
	return out
}

func setupScheduled(t *testing.T) *testBundle {
	t.Helper()
	b := setup(t)
	_, err := b.pool.Exec(context.Background(), `CREATE TABLE schedules (id serial PRIMARY KEY, run_id text, token bigint, at timestamptz)`)
	require.NoError(t, err)
	return b
}

func TestClaimsScheduleInTheClaimingTransaction(t *testing.T) {
	t.Parallel()
	b := setupScheduled(t)
	workflows := engine.NewWorkflows()
	wf := registerCharge(t, workflows, nil)
	c := b.client(t, workflows, &engine.Config{Scheduler: tableScheduler{}})
	ctx := context.Background()

	res, err := wf.Start(ctx, c, "k1", order{Customer: "a"}, nil)
	require.NoError(t, err)
	got := b.schedules(t, res.Run.ID)
	require.Len(t, got, 1)
	require.EqualValues(t, 1, got[0].Token)
	require.WithinDuration(t, res.Run.CreatedAt.Add(30*time.Second), got[0].At, time.Second, "Start schedules at the lease's expiry")

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	res, err = wf.StartTx(ctx, c, tx, "k2", order{Customer: "b"}, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Empty(t, b.schedules(t, res.Run.ID), "no schedule survives a rolled-back StartTx")

	tx, err = b.pool.Begin(ctx)
	require.NoError(t, err)
	res, err = wf.StartTx(ctx, c, tx, "k2", order{Customer: "b"}, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	got = b.schedules(t, res.Run.ID)
	require.Len(t, got, 1)
	require.EqualValues(t, 0, got[0].Token)
	require.WithinDuration(t, res.Run.CreatedAt, got[0].At, time.Second, "an unleased run is scheduled now")

	_, err = c.Resume(ctx, res.Run.ID)
	require.NoError(t, err)
	got = b.schedules(t, res.Run.ID)
	require.Len(t, got, 2, "a takeover schedules its own lease")
	require.EqualValues(t, 1, got[1].Token)
}

func TestShutdownHandsOverRunsThatOutlastTheGrace(t *testing.T) {
	t.Parallel()
	b := setupScheduled(t)
	workflows := engine.NewWorkflows()
	inPhase := make(chan struct{}, 1)
	_, err := engine.Register(workflows, "long", func(ctx context.Context, _ struct{}) (struct{}, error) {
		if _, err := engine.Atomic(ctx, "first", func(context.Context, pgx.Tx) (int, error) { return 1, nil }); err != nil {
			return struct{}{}, err
		}
		return engine.Atomic(ctx, "second", func(ctx context.Context, _ pgx.Tx) (struct{}, error) {
			inPhase <- struct{}{}
			<-ctx.Done()
			return struct{}{}, ctx.Err()
		})
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{Scheduler: tableScheduler{}})

	done := make(chan error, 1)
	var res *engine.StartResult
	go func() {
		var err error
		res, err = c.Start(context.Background(), engine.StartParams{Workflow: "long", IdempotencyKey: "k", Input: []byte(`{}`)})
		done <- err
	}()
	receive(t, inPhase)

	grace, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.NoError(t, c.Shutdown(grace))
	require.ErrorIs(t, receive(t, done), engine.ErrShutdown)

	run := res.Run
	require.Equal(t, engine.StatusPending, run.Status)
	require.Nil(t, run.LeaseExpiresAt, "the lease is released")
	require.EqualValues(t, 2, run.LeaseToken, "with a new token")
	require.Equal(t, "first", run.RecoveryPoint)
	got := b.schedules(t, run.ID)
	require.Len(t, got, 2)
	require.Equal(t, scheduled{Token: 2, At: run.UpdatedAt}, got[1], "scheduled to continue now")

	_, err = c.Start(context.Background(), engine.StartParams{Workflow: "long", IdempotencyKey: "k2", Input: []byte(`{}`)})
	require.ErrorIs(t, err, engine.ErrShutdown, "a client shutting down takes no new work")
}

func TestShutdownWaitsForExecutionsThatFinishInTime(t *testing.T) {
	t.Parallel()
	b := setupScheduled(t)
	workflows := engine.NewWorkflows()
	release := make(chan struct{})
	inPhase := make(chan struct{}, 1)
	_, err := engine.Register(workflows, "short", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "only", func(context.Context, pgx.Tx) (int, error) {
			inPhase <- struct{}{}
			<-release
			return 7, nil
		})
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	done := make(chan *engine.StartResult, 1)
	go func() {
		res, err := c.Start(context.Background(), engine.StartParams{Workflow: "short", IdempotencyKey: "k", Input: []byte(`{}`)})
		assertNoError(t, err)
		done <- res
	}()
	receive(t, inPhase)
	shut := make(chan error, 1)
	go func() { shut <- c.Shutdown(context.Background()) }()
	close(release)
	require.NoError(t, receive(t, shut))
	require.Equal(t, engine.StatusSucceeded, receive(t, done).Run.Status)
}
