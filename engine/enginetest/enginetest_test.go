package enginetest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
)

func TestNewDatabaseIsMigratedAndDroppedOnClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := enginetest.NewDatabase(ctx, &enginetest.Options{MaxConns: 2})
	require.NoError(t, err)
	workflows := engine.NewWorkflows()
	c, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	require.NoError(t, err)
	require.NoError(t, c.Ping(ctx), "every migration applied")
	var name string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT current_database()`).Scan(&name))

	require.NoError(t, db.Close())
	admin, err := pgx.Connect(ctx, enginetest.AdminURL())
	require.NoError(t, err)
	defer admin.Close(ctx)
	var exists bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists))
	require.False(t, exists, "dropped")
}

func TestCrashAfterThenRecover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := enginetest.New(t, nil)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE effects (phase text)`)
	require.NoError(t, err)
	workflows := engine.NewWorkflows()
	wf, err := engine.Register(workflows, "two", func(ctx context.Context, _ struct{}) (int, error) {
		for _, phase := range []string{"one", "two"} {
			if _, err := engine.Atomic(ctx, phase, func(ctx context.Context, tx pgx.Tx) (int, error) {
				_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, phase)
				return 0, err
			}, nil); err != nil {
				return 0, err
			}
		}
		return 2, nil
	}, nil)
	require.NoError(t, err)
	dead, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	require.NoError(t, err)

	res, err := wf.Start(enginetest.CrashAfter(ctx, "one"), dead, "k", struct{}{}, nil)
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	run := enginetest.RequireStatus(t, dead, res.Run.ID, engine.StatusRunning)
	require.Equal(t, "one", run.RecoveryPoint, "phase one committed")
	require.Equal(t, dead.ID(), *run.LeaseOwner, "the lease stays with the dead executor")
	enginetest.RequirePhases(t, dead, run.ID, "one")

	successor, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	require.NoError(t, err)
	run, err = db.Recover(ctx, successor, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	enginetest.RequirePhases(t, successor, run.ID, "one", "two")
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n))
	require.Equal(t, 2, n, "phase one ran once")
}

// fakeTB records a failure instead of failing the test.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	panic(f)
}

func failure(f func(tb testing.TB)) (msg string) {
	tb := &fakeTB{}
	defer func() {
		if r := recover(); r != nil && r != any(tb) {
			panic(r)
		}
		msg = tb.failed
	}()
	f(tb)
	return ""
}

func TestAssertionsFailOnAMismatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := enginetest.New(t, nil)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "one", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "only", func(context.Context, pgx.Tx) (int, error) { return 1, nil }, nil)
	}, nil)
	require.NoError(t, err)
	c, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	require.NoError(t, err)
	res, err := c.Start(ctx, engine.StartParams{Workflow: "one", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)

	require.Empty(t, failure(func(tb testing.TB) { enginetest.RequirePhases(tb, c, res.Run.ID, "only") }))
	require.Contains(t, failure(func(tb testing.TB) { enginetest.RequirePhases(tb, c, res.Run.ID, "only", "more") }), `want ["only" "more"]`)
	require.Contains(t, failure(func(tb testing.TB) { enginetest.RequireStatus(tb, c, res.Run.ID, engine.StatusFailed) }), "is succeeded, want failed")
}
