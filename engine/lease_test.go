package engine_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
)

// logCapture is a logger whose lines a test can read.
type logCapture struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logCapture) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logCapture) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logCapture) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

func TestASupersededExecutionIsReportedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "taken", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "only", func(ctx context.Context, _ pgx.Tx) (int, error) {
			// Another executor takes the run over meanwhile.
			_, err := b.pool.Exec(ctx, `UPDATE ratchet.runs SET lease_token = lease_token + 1`)
			return 1, err
		}, nil)
	}, nil)
	require.NoError(t, err)
	logs := &logCapture{}
	c := b.client(t, workflows, &engine.Config{Logger: logs.logger()})
	_, err = c.Start(context.Background(), engine.StartParams{Workflow: "taken", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.ErrorIs(t, err, engine.ErrLeaseLost)
	require.Equal(t, 1, strings.Count(logs.String(), "superseded"), logs.String())
}

func TestAnExecutionWhoseHeartbeatsFailStopsBeforeItsLeaseMayExpire(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	inCall := make(chan struct{}, 1)
	calls := 0
	var cut time.Time
	_, err := engine.Register(workflows, "cut-off", func(ctx context.Context, _ struct{}) (string, error) {
		return engine.Step(ctx, "called", func(ctx context.Context, _ steps.Key) (string, error) {
			calls++
			inCall <- struct{}{}
			<-ctx.Done() // a slow downstream
			cut = time.Now()
			return "", ctx.Err()
		}, &engine.StepOpts[string]{Policy: &steps.Policy{MaxAttempts: 1}})
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{StaleAfter: 3 * time.Second})
	done := make(chan error, 1)
	go func() {
		_, err := c.Start(ctx, engine.StartParams{Workflow: "cut-off", IdempotencyKey: "k", Input: []byte(`{}`)})
		done <- err
	}()
	receive(t, inCall)

	// A partition between the executor and its database, as the
	// heartbeat sees it: its statements hang.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT 1 FROM ratchet.runs FOR UPDATE`)
	require.NoError(t, err)

	err = receive(t, done)
	require.ErrorIs(t, err, engine.ErrLeaseLost)
	require.Equal(t, 1, calls)
	// The call was cut while the lease, as the database counts it (from
	// the last statement that extended it), was still its own.
	var expires time.Time
	require.NoError(t, tx.QueryRow(ctx, `SELECT lease_expires_at FROM ratchet.runs`).Scan(&expires))
	require.True(t, cut.Before(expires), "cut at %s, the lease expired at %s", cut, expires)
}

// TestAClaimContinuedTooLateRunsNothing continues a run ClaimDue claimed
// once its lease has expired by the database's clock (nobody took it
// over, so its token is still the claim's): the execution must not count
// its lease from when it began, and calls nothing.
func TestAClaimContinuedTooLateRunsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	calls := 0
	_, err := engine.Register(workflows, "late", func(ctx context.Context, _ struct{}) (string, error) {
		return engine.Step(ctx, "called", func(ctx context.Context, _ steps.Key) (string, error) {
			calls++
			return "ok", nil
		}, nil)
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{StaleAfter: time.Second})
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = c.StartTx(ctx, tx, engine.StartParams{Workflow: "late", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	claimed, err := c.ClaimDue(ctx, 10)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.Eventually(t, func() bool {
		var expired bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT lease_expires_at < now() FROM ratchet.runs`).Scan(&expired))
		return expired
	}, time.Minute, 20*time.Millisecond)

	_, err = c.Continue(ctx, claimed[0])
	require.ErrorIs(t, err, engine.ErrLeaseLost)
	require.Zero(t, calls, "nothing called on a lease that may be another's")
	run, err := c.GetRun(ctx, claimed[0].ID)
	require.NoError(t, err)
	require.False(t, run.Status.Finished(), "left for the next executor")
}

func TestACancelThatCommitsWhileAPhaseCommitWaitsStopsTheRunAsCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	inPhase, proceed := make(chan struct{}, 1), make(chan struct{})
	_, err := engine.Register(workflows, "long", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "only", func(context.Context, pgx.Tx) (int, error) {
			inPhase <- struct{}{}
			<-proceed
			return 1, nil
		}, nil)
	}, nil)
	require.NoError(t, err)
	logs := &logCapture{}
	c := b.client(t, workflows, &engine.Config{Logger: logs.logger()})
	done := make(chan *engine.StartResult, 1)
	go func() {
		res, _ := c.Start(ctx, engine.StartParams{Workflow: "long", IdempotencyKey: "k", Input: []byte(`{}`)})
		done <- res
	}()
	receive(t, inPhase)

	// The cancel takes the run's row lock first; the phase's commit
	// statement queues behind it.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `UPDATE ratchet.runs SET cancel_requested_at = now()`)
	require.NoError(t, err)
	close(proceed)
	require.Eventually(t, func() bool { // an observable state of another session, not a timing guess
		var waiting bool
		err := b.pool.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%WITH advanced%'`).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, tx.Commit(ctx))

	run := receive(t, done).Run
	require.Equal(t, engine.StatusCancelled, run.Status, "cancelled at the boundary, not left leased")
	require.NotContains(t, logs.String(), "superseded", "a cancel is not a lost lease")
}

// What a cancel promises: no phase after it. A run whose workflow returns
// without reaching another phase boundary finishes as it returned, its
// cancel_requested_at recording the request that came too late.
func TestACancelAfterTheLastPhaseLetsTheRunFinishAsItReturns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	committed, proceed := make(chan struct{}, 1), make(chan struct{})
	_, err := engine.Register(workflows, "late", func(ctx context.Context, _ struct{}) (int, error) {
		n, err := engine.Atomic(ctx, "only", func(context.Context, pgx.Tx) (int, error) { return 1, nil }, nil)
		committed <- struct{}{}
		<-proceed
		return n, err
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	done := make(chan *engine.StartResult, 1)
	go func() {
		res, _ := c.Start(ctx, engine.StartParams{Workflow: "late", IdempotencyKey: "k", Input: []byte(`{}`)})
		done <- res
	}()
	receive(t, committed)
	requested, err := c.Cancel(ctx, b.runIDForKey(t, "k"))
	require.NoError(t, err)
	require.Equal(t, engine.CancelRequested, requested.Outcome)
	require.Equal(t, engine.StatusRunning, requested.Run.Status, "held by a live executor: requested, not done")
	close(proceed)
	run := receive(t, done).Run
	require.Equal(t, engine.StatusSucceeded, run.Status)
	require.NotNil(t, run.CancelRequestedAt)
}
