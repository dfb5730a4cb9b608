package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
)

func TestClaimedRunsAreHandedOverAtOnceWhenShutdownBegins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	executed := false
	_, err := engine.Register(workflows, "noop", func(context.Context, struct{}) (int, error) { executed = true; return 1, nil }, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	startUnleased(t, b, c, "noop", "discovered")
	discovered, err := c.ClaimDue(ctx, 1)
	require.NoError(t, err)
	require.Len(t, discovered, 1)
	inline, err := c.Claim(ctx, engine.StartParams{Workflow: "noop", IdempotencyKey: "inline", Input: []byte(`{}`)})
	require.NoError(t, err)

	// Shutdown begins between the claims and the executions.
	require.NoError(t, c.Shutdown(ctx))
	handed, err := c.Continue(ctx, discovered[0])
	require.ErrorIs(t, err, engine.ErrShutdown)
	handedInline, err := c.Execute(ctx, inline)
	require.ErrorIs(t, err, engine.ErrShutdown)
	require.False(t, executed, "nothing executes once Shutdown has begun")
	for _, pair := range [][2]*engine.Run{{discovered[0], handed}, {inline.Run, handedInline}} {
		claimed, run := pair[0], pair[1]
		require.Equal(t, engine.StatusPending, run.Status)
		require.Nil(t, run.LeaseOwner)
		require.Equal(t, claimed.LeaseToken+1, run.LeaseToken, "a new token fences the claim")
		require.Equal(t, run.UpdatedAt, *run.DueAt, "due at once, not when the lease would have expired")
	}
	_, err = c.ClaimDue(ctx, 1)
	require.ErrorIs(t, err, engine.ErrShutdown, "a client shutting down claims nothing")

	other := b.client(t, workflows, nil)
	runs, err := other.ClaimDue(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, runIDs([]*engine.Run{handed, handedInline}), runIDs(runs), "another client takes both over at once")
}

func TestShutdownHandsOverRunsThatOutlastTheGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	inPhase := make(chan struct{}, 1)
	_, err := engine.Register(workflows, "long", func(ctx context.Context, _ struct{}) (struct{}, error) {
		if _, err := engine.Atomic(ctx, "first", func(context.Context, pgx.Tx) (int, error) { return 1, nil }, nil); err != nil {
			return struct{}{}, err
		}
		return engine.Atomic(ctx, "second", func(ctx context.Context, _ pgx.Tx) (struct{}, error) {
			inPhase <- struct{}{}
			<-ctx.Done()
			return struct{}{}, ctx.Err()
		}, nil)
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)

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
	require.Equal(t, run.UpdatedAt, *run.DueAt, "due to continue now")

	_, err = c.Start(context.Background(), engine.StartParams{Workflow: "long", IdempotencyKey: "k2", Input: []byte(`{}`)})
	require.ErrorIs(t, err, engine.ErrShutdown, "a client shutting down takes no new work")
}

func TestShutdownWaitsForExecutionsThatFinishInTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	release := make(chan struct{})
	inPhase := make(chan struct{}, 1)
	_, err := engine.Register(workflows, "short", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "only", func(context.Context, pgx.Tx) (int, error) {
			inPhase <- struct{}{}
			<-release
			return 7, nil
		}, nil)
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

func TestShutdownCalledTwiceReturnsBothAndEndsASecondAfterTheGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	inPhase := make(chan struct{}, 1)
	_, err := engine.Register(workflows, "deaf", func(ctx context.Context, _ struct{}) (int, error) {
		inPhase <- struct{}{}
		<-stuck // ignores its context: a step without a timeout, say
		return 0, ctx.Err()
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	go c.Start(context.Background(), engine.StartParams{Workflow: "deaf", IdempotencyKey: "k", Input: []byte(`{}`)}) //nolint:errcheck
	receive(t, inPhase)

	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		first <- c.Shutdown(ctx)
	}()
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	second := c.Shutdown(ctx)
	require.ErrorIs(t, second, context.DeadlineExceeded, "an execution that ignores its context outlasts the hand-over")
	require.ErrorContains(t, second, "1 executions still running")
	require.ErrorIs(t, receive(t, first), context.DeadlineExceeded)
	// The execution never ends (until the test's cleanup): a Shutdown that
	// waited for it would not return at all.
	require.Less(t, time.Since(began), 300*time.Millisecond+10*time.Second, "bounded by the grace and the hand-over")
}

func TestAStepWhoseCallReturnedIsCommittedEvenWhileHandedOver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	inCall := make(chan struct{}, 1)
	_, err := engine.Register(workflows, "pay", func(ctx context.Context, _ struct{}) (string, error) {
		id, err := engine.Step(ctx, "charged", func(ctx context.Context, _ steps.Key) (string, error) {
			inCall <- struct{}{}
			<-ctx.Done()       // the hand-over cancels the execution…
			return "ch_1", nil // …just as the downstream answers: the charge happened
		}, nil)
		if err != nil {
			return "", err
		}
		return engine.Atomic(ctx, "recorded", func(context.Context, pgx.Tx) (string, error) { return id, nil }, nil)
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	done := make(chan *engine.StartResult, 1)
	go func() {
		res, _ := c.Start(context.Background(), engine.StartParams{Workflow: "pay", IdempotencyKey: "k", Input: []byte(`{}`)})
		done <- res
	}()
	receive(t, inCall)
	grace, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.NoError(t, c.Shutdown(grace))
	run := receive(t, done).Run
	require.Equal(t, engine.StatusPending, run.Status, "handed over")
	require.Equal(t, "charged", run.RecoveryPoint, "with the call's result in the journal: the next executor does not call again")
	phases, err := c.Phases(context.Background(), run.ID)
	require.NoError(t, err)
	require.Len(t, phases, 1)
	require.JSONEq(t, `"ch_1"`, string(phases[0].Output))
}
