package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/internal/testdb"
	"github.com/ratchet-run/ratchet/steps"
)

func TestAPhaseReturnsWhatItsReplayWillReturn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	type withPrivate struct {
		Public  int
		private int
	}
	var (
		mu   sync.Mutex
		seen []string
	)
	_, err := engine.Register(workflows, "lossy", func(ctx context.Context, _ struct{}) (int, error) {
		v, err := engine.Atomic(ctx, "made", func(context.Context, pgx.Tx) (withPrivate, error) { return withPrivate{Public: 1, private: 7}, nil }, nil)
		if err != nil {
			return 0, err
		}
		at, err := engine.Step(ctx, "stamped", func(context.Context, steps.Key) (time.Time, error) {
			return time.Date(2026, 12, 2, 12, 0, 0, 0, time.FixedZone("CET", 3600)), nil
		}, nil)
		if err != nil {
			return 0, err
		}
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%d %s", v.private, at.Location()))
		if len(seen) == 1 {
			return 0, errors.New("fail once, after both phases")
		}
		return v.Public, nil
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{Retry: constantRetry(0)})
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: "lossy", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	_, err = c.TakeOver(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.Len(t, seen, 2)
	require.Equal(t, seen[1], seen[0], "the first execution saw what the replay saw")
}

func TestMisconfigurationsSayWhatToDo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "idle", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "slow", func(ctx context.Context, tx pgx.Tx) (int, error) {
			// Idle in the transaction until Postgres ends its session.
			pid := tx.Conn().PgConn().PID()
			require.Eventually(t, func() bool {
				var alive bool
				require.NoError(t, b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive))
				return !alive
			}, time.Minute, 20*time.Millisecond, "idle_in_transaction_session_timeout ends the session")
			return 1, nil
		}, nil)
	}, nil)
	require.NoError(t, err)
	_, err = engine.Register(workflows, "unmigrated", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "write", func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, `INSERT INTO app.orders VALUES (1)`)
			return 1, err
		}, nil)
	}, nil)
	require.NoError(t, err)
	// A lease long enough that a loaded machine's late heartbeat does not
	// lose it (300 ms did, under the whole suite): it is also how long the
	// idle phase waits for Postgres to end its session.
	c := b.client(t, workflows, &engine.Config{StaleAfter: 3 * time.Second, Retry: constantRetry(time.Hour)})

	res, err := c.Start(ctx, engine.StartParams{Workflow: "idle", IdempotencyKey: "a", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, res.Run.Status)
	require.Equal(t, engine.CodePhaseIdleTimeout, res.Run.Error.Code, "%+v", res.Run.Error)
	require.Contains(t, res.Run.Error.Message, "do slow work")
	require.Contains(t, res.Run.Error.Message, "3s")

	res, err = c.Start(ctx, engine.StartParams{Workflow: "unmigrated", IdempotencyKey: "b", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.CodeUndefinedTable, res.Run.Error.Code, "%+v", res.Run.Error)
	require.Contains(t, res.Run.Error.Message, "ratchet migrate")
	require.True(t, res.Run.Error.Retryable, "an operator may mend it")
}

func TestAClientOnAnUnmigratedDatabaseSaysHowToMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewEmpty(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "noop", func(context.Context, struct{}) (int, error) { return 1, nil }, nil)
	require.NoError(t, err)
	c, err := engine.NewClient(pool, &engine.Config{Workflows: workflows})
	require.NoError(t, err)

	_, err = c.Start(ctx, engine.StartParams{Workflow: "noop", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.ErrorIs(t, err, engine.ErrNotMigrated)
	require.ErrorContains(t, err, "ratchet migrate")
	_, err = c.ClaimDue(ctx, 1)
	require.ErrorIs(t, err, engine.ErrNotMigrated, "a worker's poll says so too")
	_, err = c.ListRuns(ctx, engine.ListParams{})
	require.ErrorIs(t, err, engine.ErrNotMigrated)
}

func TestRunInfoFromTellsAWorkflowWhichRunItIs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	var inWorkflow, inPhase engine.RunInfo
	_, err := engine.Register(workflows, "self", func(ctx context.Context, _ struct{}) (int, error) {
		inWorkflow, _ = engine.RunInfoFrom(ctx)
		return engine.Atomic(ctx, "p", func(ctx context.Context, _ pgx.Tx) (int, error) {
			inPhase, _ = engine.RunInfoFrom(ctx)
			return 1, nil
		}, nil)
	}, &engine.WorkflowOpts{Version: 3})
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: "self", IdempotencyKey: "k", Input: []byte(`{}`), StartOpts: engine.StartOpts{Tenant: "acme"}})
	require.NoError(t, err)
	want := engine.RunInfo{RunID: res.Run.ID, Tenant: "acme", Workflow: "self", Version: 3, Attempt: 1, LeaseToken: 1, RecoveryPoint: "started"}
	require.Equal(t, want, inWorkflow)
	require.Equal(t, want, inPhase)
	_, ok := engine.RunInfoFrom(context.Background())
	require.False(t, ok, "outside a run")
}

// An atomic phase's permanent failure is journaled, as a step's is: a
// workflow that branches on it takes the same branch when resumed, rather
// than run the phase again where the journal holds the branch.
func TestAnAtomicPhasesPermanentFailureIsReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "branch", func(ctx context.Context, _ struct{}) (int, error) {
		n, err := engine.Atomic(ctx, "checked", func(ctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := bump(ctx, tx, "checked"); err != nil {
				return 0, err
			}
			return 0, steps.Permanent("refused", errors.New("refused"))
		}, nil)
		if err != nil {
			if _, ferr := engine.Atomic(ctx, "refusal_recorded", func(ctx context.Context, tx pgx.Tx) (int, error) {
				return bump(ctx, tx, "recorded")
			}, nil); ferr != nil {
				return 0, ferr
			}
		}
		return n, err
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	ctx := context.Background()
	res, err := c.Start(enginetest.CrashAfter(ctx, "refusal_recorded"), engine.StartParams{Workflow: "branch", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	b.expireLease(t, res.Run.ID)
	run, err := c.TakeOver(ctx, res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, run.Status)
	require.Equal(t, "refused", run.Error.Code, "not a non-determinism")
	phases := enginetest.RequirePhases(t, c, run.ID, "checked", "refusal_recorded")
	require.Equal(t, "refused", phases[0].Error.Code)
	require.Equal(t, 0, b.counter(t, "checked"), "the failed phase's writes rolled back, and it did not run again")
	require.Equal(t, 1, b.counter(t, "recorded"))
}

// Each phase records the execution that committed it: a run taken over
// after a crash replays the first execution's phases and commits the rest
// under its own attempt number.
func TestAPhaseRecordsTheExecutionThatCommittedIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "two", func(ctx context.Context, _ struct{}) (int, error) {
		for _, name := range []string{"first", "second"} {
			if _, err := engine.Atomic(ctx, name, func(ctx context.Context, tx pgx.Tx) (int, error) {
				return bump(ctx, tx, name)
			}, nil); err != nil {
				return 0, err
			}
		}
		return 0, nil
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	ctx := context.Background()
	res, err := c.Start(enginetest.CrashAfter(ctx, "first"), engine.StartParams{Workflow: "two", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	b.expireLease(t, res.Run.ID)
	run, err := c.TakeOver(ctx, res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	require.Equal(t, 2, run.Attempt)
	phases := enginetest.RequirePhases(t, c, run.ID, "first", "second")
	require.Equal(t, 1, phases[0].Execution, "committed by the crashed execution, replayed by the second")
	require.Equal(t, 2, phases[1].Execution)
	require.Equal(t, 1, b.counter(t, "first"))
}
