package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
)

// gate registers "gated": a phase that waits for release, then one that
// bumps counter "after". entered receives when the first phase begins.
func gate(t *testing.T) (workflows *engine.Workflows, wf *engine.Workflow[struct{}, int], entered chan struct{}, release chan struct{}) {
	t.Helper()
	workflows = engine.NewWorkflows()
	entered, release = make(chan struct{}, 10), make(chan struct{})
	wf, err := engine.Register(workflows, "gated", func(ctx context.Context, _ struct{}) (int, error) {
		if _, err := engine.Atomic(ctx, "waited", func(ctx context.Context, _ pgx.Tx) (int, error) {
			entered <- struct{}{}
			select {
			case <-release:
				return 1, nil
			case <-ctx.Done():
				return 0, context.Cause(ctx)
			}
		}, nil); err != nil {
			return 0, err
		}
		return engine.Atomic(ctx, "after", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "after") }, nil)
	}, nil)
	require.NoError(t, err)
	return workflows, wf, entered, release
}

// The HTTP trap: a handler that starts a run with its request's context
// and whose client hangs up must not abandon the run to its lease.
func TestStartWhoseCallerGoesAwayLeavesTheRunExecuting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows, wf, entered, release := gate(t)
	ends := make(runEnds, 10)
	c := b.client(t, workflows, &engine.Config{StaleAfter: time.Minute, Hooks: ends})

	reqCtx, hangUp := context.WithCancel(context.Background())
	returned := make(chan error, 1)
	go func() {
		_, err := wf.Start(reqCtx, c, "k", struct{}{}, nil)
		returned <- err
	}()
	receive(t, entered)
	hangUp()
	require.ErrorIs(t, receive(t, returned), context.Canceled, "Start stops waiting")

	close(release)
	require.Equal(t, engine.StatusSucceeded, receive(t, ends).Status)
	run, err := c.GetRun(context.Background(), b.runIDForKey(t, "k"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	require.Equal(t, 1, run.Attempt, "finished by the execution Start began, not by a takeover")
	require.Equal(t, 1, b.counter(t, "after"))
}

func TestStartWaitBoundsTheWaitNotTheExecution(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows, wf, entered, release := gate(t)
	ends := make(runEnds, 10)
	c := b.client(t, workflows, &engine.Config{Hooks: ends})

	res, err := wf.Start(context.Background(), c, "k", struct{}{}, &engine.StartOpts{Wait: 50 * time.Millisecond})
	require.NoError(t, err, "a wait that elapses is not an error")
	require.Equal(t, engine.OutcomeCreated, res.Outcome)
	require.Equal(t, engine.StatusRunning, res.Run.Status, "returned while the run executes")
	receive(t, entered)
	close(release)
	require.Equal(t, engine.StatusSucceeded, receive(t, ends).Status)

	// A negative wait returns once the run is claimed.
	res, err = wf.Start(context.Background(), c, "k2", struct{}{}, &engine.StartOpts{Wait: -1})
	require.NoError(t, err)
	require.Equal(t, engine.StatusRunning, res.Run.Status)
	require.Equal(t, engine.StatusSucceeded, receive(t, ends).Status)
}

// runEnds receives how each execution ended.
type runEnds chan engine.RunEnd

func (e runEnds) Run(ctx context.Context, _ engine.RunInfo) (context.Context, func(engine.RunEnd)) {
	return ctx, func(end engine.RunEnd) { e <- end }
}

func (e runEnds) Phase(ctx context.Context, _ engine.PhaseInfo) (context.Context, func(error)) {
	return ctx, func(error) {}
}

// A takeover whose caller cancels releases the run at once, for another
// executor, instead of holding the lease until it expires.
func TestTakeOverStoppedByItsCallerReleasesTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows, _, entered, release := gate(t)
	defer close(release)
	c := b.client(t, workflows, &engine.Config{StaleAfter: time.Minute})
	runID := startUnleased(t, b, c, "gated", "k").ID

	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan error, 1)
	go func() {
		_, err := c.TakeOver(ctx, runID)
		returned <- err
	}()
	receive(t, entered)
	cancel()
	require.ErrorIs(t, receive(t, returned), context.Canceled)

	run, err := c.GetRun(context.Background(), runID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, run.Status)
	require.Nil(t, run.LeaseOwner, "released, not left to expire")
	require.EqualValues(t, 2, run.LeaseToken, "with a new token, fencing the stopped execution")
	require.NotNil(t, run.DueAt)
	require.False(t, run.DueAt.After(time.Now().Add(time.Second)), "due at once")
}

// MaxInline bounds inline executions: a Start beyond it leaves the run,
// unleased and due, to a worker, and says so by its status.
func TestMaxInlineLeavesExtraRunsToAWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows, wf, entered, release := gate(t)
	c := b.client(t, workflows, &engine.Config{MaxInline: 1})

	_, err := wf.Start(context.Background(), c, "first", struct{}{}, &engine.StartOpts{Wait: -1})
	require.NoError(t, err)
	receive(t, entered) // the one slot is taken
	second, err := wf.Start(context.Background(), c, "second", struct{}{}, nil)
	require.NoError(t, err, "not an error: the run exists and will be executed")
	require.Equal(t, engine.OutcomeCreated, second.Outcome)
	require.Equal(t, engine.StatusPending, second.Run.Status)
	require.Nil(t, second.Run.LeaseOwner, "unleased, for a worker")
	require.NotNil(t, second.Run.DueAt)

	close(release)
	due, err := c.ClaimDue(context.Background(), 10)
	require.NoError(t, err)
	require.Equal(t, []string{second.Run.ID}, runIDs(due), "due at once")
	run, err := c.Continue(context.Background(), due[0])
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
}
