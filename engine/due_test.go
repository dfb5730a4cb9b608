package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
)

// startUnleased creates a pending, unleased run with StartTx, as a service
// does in its own transaction.
func startUnleased(t *testing.T, b *testBundle, c *engine.Client, workflow, key string) *engine.Run {
	t.Helper()
	ctx := context.Background()
	var run *engine.Run
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		res, err := c.StartTx(ctx, tx, engine.StartParams{Workflow: workflow, IdempotencyKey: key, Input: []byte(`{}`)})
		if err == nil {
			run = res.Run
		}
		return err
	}))
	return run
}

func runIDs(runs []*engine.Run) []string {
	ids := make([]string, len(runs))
	for i, r := range runs {
		ids[i] = r.ID
	}
	slices.Sort(ids)
	return ids
}

func TestClaimDueTakesOverExactlyTheRunsThatAreDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	failOnce := map[string]bool{}
	var mu sync.Mutex
	_, err := engine.Register(workflows, "flaky", func(ctx context.Context, in struct{ Key string }) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if !failOnce[in.Key] {
			failOnce[in.Key] = true
			return 0, errors.New("downstream unavailable")
		}
		return 1, nil
	}, nil)
	require.NoError(t, err)
	_, err = engine.Register(workflows, "noop", func(context.Context, struct{}) (int, error) { return 1, nil }, nil)
	require.NoError(t, err)
	backoffs := map[string]time.Duration{}
	c := b.client(t, workflows, &engine.Config{RetryBackoff: func(int) time.Duration { return backoffs["next"] }})

	pending := startUnleased(t, b, c, "noop", "pending")
	claimed, err := c.Claim(ctx, engine.StartParams{Workflow: "noop", IdempotencyKey: "live", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, claimed.Run.LeaseExpiresAt, claimed.Run.DueAt, "a leased run is due when its lease expires")
	expired, err := c.Claim(ctx, engine.StartParams{Workflow: "noop", IdempotencyKey: "expired", Input: []byte(`{}`)})
	require.NoError(t, err)
	b.expireLease(t, expired.Run.ID)
	finished, err := c.Start(ctx, engine.StartParams{Workflow: "noop", IdempotencyKey: "finished", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Nil(t, finished.Run.DueAt, "a finished run is never due")

	start := func(key string, backoff time.Duration) *engine.Run {
		backoffs["next"] = backoff
		res, err := c.Start(ctx, engine.StartParams{Workflow: "flaky", IdempotencyKey: key, Input: []byte(`{"Key": "` + key + `"}`)})
		require.NoError(t, err)
		require.Equal(t, engine.StatusPending, res.Run.Status)
		require.Equal(t, res.Run.NextAttemptAt, res.Run.DueAt, "a run backing off is due when the backoff ends")
		return res.Run
	}
	retryDue := start("retry-due", 0)
	start("retry-later", time.Hour)

	// A run of a workflow this client does not know is left to a process
	// that does.
	others := engine.NewWorkflows()
	_, err = engine.Register(others, "elsewhere", func(context.Context, struct{}) (int, error) { return 1, nil }, nil)
	require.NoError(t, err)
	startUnleased(t, b, b.client(t, others, nil), "elsewhere", "elsewhere")

	runs, err := c.ClaimDue(ctx, 100)
	require.NoError(t, err)
	require.Equal(t, runIDs([]*engine.Run{pending, expired.Run, retryDue}), runIDs(runs))
	for _, r := range runs {
		require.Equal(t, engine.StatusRunning, r.Status)
		require.Equal(t, c.ID(), *r.LeaseOwner)
		require.Nil(t, r.NextAttemptAt)
		require.Equal(t, r.LeaseExpiresAt, r.DueAt)
	}
	again, err := c.ClaimDue(ctx, 100)
	require.NoError(t, err)
	require.Empty(t, again, "claimed runs are leased, so no longer due")

	for _, r := range runs {
		final, err := c.Continue(ctx, r)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, final.Status, "run %s", r.IdempotencyKey)
	}
}

func TestClaimDueFromManyClientsClaimsEveryRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "noop", func(context.Context, struct{}) (int, error) { return 1, nil }, nil)
	require.NoError(t, err)
	const runs = 300
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		c := b.client(t, workflows, nil)
		for i := range runs {
			if _, err := c.StartTx(ctx, tx, engine.StartParams{Workflow: "noop", IdempotencyKey: fmt.Sprint(i), Input: []byte(`{}`)}); err != nil {
				return err
			}
		}
		return nil
	}))

	var (
		mu   sync.Mutex
		seen = map[string]int{}
		wg   sync.WaitGroup
	)
	for range 4 {
		c := b.client(t, workflows, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				claimed, err := c.ClaimDue(ctx, 7)
				if !assertNoError(t, err) || len(claimed) == 0 {
					return
				}
				mu.Lock()
				for _, r := range claimed {
					seen[r.ID]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Len(t, seen, runs)
	for id, n := range seen {
		require.Equal(t, 1, n, "run %s claimed %d times", id, n)
	}
}

func TestContinueExecutesFromTheRecoveryPoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	executions := 0
	_, err := engine.Register(workflows, "two", func(ctx context.Context, _ struct{}) (int, error) {
		executions++
		if _, err := engine.Atomic(ctx, "first", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "first") }); err != nil {
			return 0, err
		}
		if executions == 1 {
			return 0, errors.New("fails once between the phases")
		}
		return engine.Atomic(ctx, "second", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "second") })
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{RetryBackoff: func(int) time.Duration { return 0 }})
	res, err := c.Start(ctx, engine.StartParams{Workflow: "two", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, "first", res.Run.RecoveryPoint)

	runs, err := c.ClaimDue(ctx, 10)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	final, err := c.Continue(ctx, runs[0])
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, final.Status)
	require.Equal(t, 1, b.counter(t, "first"), "the committed phase replayed, not repeated")
	require.Equal(t, 1, b.counter(t, "second"))

	_, err = c.Continue(ctx, res.Run)
	require.ErrorContains(t, err, "claimed by this client", "only a run this client claimed")
}

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

func TestExecutionTimeoutReleasesTheRunToBeRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "slow", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "waits", func(ctx context.Context, _ pgx.Tx) (int, error) {
			<-ctx.Done()
			return 0, ctx.Err()
		})
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{RetryBackoff: func(int) time.Duration { return time.Hour }})
	startUnleased(t, b, c, "slow", "k")
	runs, err := c.ClaimDue(ctx, 1)
	require.NoError(t, err)
	require.Len(t, runs, 1)

	limited, cancel := context.WithTimeoutCause(ctx, 100*time.Millisecond, engine.ErrExecutionTimeout)
	defer cancel()
	run, err := c.Continue(limited, runs[0])
	require.NoError(t, err, "the run was released, not abandoned")
	require.Equal(t, engine.StatusPending, run.Status)
	require.Nil(t, run.LeaseOwner)
	require.Equal(t, engine.CodeExecutionTimeout, run.Error.Code)
	require.True(t, run.Error.Retryable)
	require.Equal(t, run.NextAttemptAt, run.DueAt, "due again after the backoff")
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
	require.ErrorContains(t, second, "1 calls still executing")
	require.ErrorIs(t, receive(t, first), context.DeadlineExceeded)
	require.Less(t, time.Since(began), 300*time.Millisecond+2*time.Second, "bounded by the grace and the hand-over")
}

func TestASupersededExecutionIsReportedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "taken", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "only", func(ctx context.Context, _ pgx.Tx) (int, error) {
			// Another executor takes the run over meanwhile.
			_, err := b.pool.Exec(ctx, `UPDATE ratchet.runs SET lease_token = lease_token + 1`)
			return 1, err
		})
	}, nil)
	require.NoError(t, err)
	var logs strings.Builder
	var mu sync.Mutex
	c := b.client(t, workflows, &engine.Config{Logger: slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))})
	_, err = c.Start(context.Background(), engine.StartParams{Workflow: "taken", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.ErrorIs(t, err, engine.ErrLeaseLost)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, strings.Count(logs.String(), "superseded"), logs.String())
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

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
		return engine.Atomic(ctx, "recorded", func(context.Context, pgx.Tx) (string, error) { return id, nil })
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
		v, err := engine.Atomic(ctx, "made", func(context.Context, pgx.Tx) (withPrivate, error) { return withPrivate{Public: 1, private: 7}, nil })
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
	c := b.client(t, workflows, &engine.Config{RetryBackoff: func(int) time.Duration { return 0 }})
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: "lossy", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	_, err = c.Resume(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.Len(t, seen, 2)
	require.Equal(t, seen[1], seen[0], "the first execution saw what the replay saw")
}

func TestAnExecutionWhoseHeartbeatsFailStopsBeforeItsLeaseMayExpire(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	inCall := make(chan struct{}, 1)
	calls := 0
	_, err := engine.Register(workflows, "cut-off", func(ctx context.Context, _ struct{}) (string, error) {
		return engine.Step(ctx, "called", func(ctx context.Context, _ steps.Key) (string, error) {
			calls++
			inCall <- struct{}{}
			<-ctx.Done() // a slow downstream
			return "", ctx.Err()
		}, &engine.StepOpts{Policy: &steps.Policy{MaxAttempts: 1}})
	}, nil)
	require.NoError(t, err)
	const staleAfter = 900 * time.Millisecond
	c := b.client(t, workflows, &engine.Config{StaleAfter: staleAfter})
	done := make(chan error, 1)
	began := time.Now()
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
	stopped := time.Since(began)
	require.ErrorIs(t, err, engine.ErrLeaseLost)
	require.Less(t, stopped, staleAfter, "stopped while the lease was surely still its own")
	require.Equal(t, 1, calls)
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
		})
	}, nil)
	require.NoError(t, err)
	var logs strings.Builder
	var mu sync.Mutex
	c := b.client(t, workflows, &engine.Config{Logger: slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))})
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
	mu.Lock()
	defer mu.Unlock()
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
		n, err := engine.Atomic(ctx, "only", func(context.Context, pgx.Tx) (int, error) { return 1, nil })
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
	require.Equal(t, engine.StatusRunning, requested.Status, "held by a live executor: requested, not done")
	close(proceed)
	run := receive(t, done).Run
	require.Equal(t, engine.StatusSucceeded, run.Status)
	require.NotNil(t, run.CancelRequestedAt)
}

func TestMisconfigurationsSayWhatToDo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "idle", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "slow", func(context.Context, pgx.Tx) (int, error) {
			time.Sleep(600 * time.Millisecond) // the mistake under test: slow work inside the transaction
			return 1, nil
		})
	}, nil)
	require.NoError(t, err)
	_, err = engine.Register(workflows, "unmigrated", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "write", func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, `INSERT INTO app.orders VALUES (1)`)
			return 1, err
		})
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{StaleAfter: 300 * time.Millisecond, RetryBackoff: func(int) time.Duration { return time.Hour }})

	res, err := c.Start(ctx, engine.StartParams{Workflow: "idle", IdempotencyKey: "a", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, res.Run.Status)
	require.Equal(t, engine.CodePhaseIdleTimeout, res.Run.Error.Code, "%+v", res.Run.Error)
	require.Contains(t, res.Run.Error.Message, "do slow work")
	require.Contains(t, res.Run.Error.Message, "300ms")

	res, err = c.Start(ctx, engine.StartParams{Workflow: "unmigrated", IdempotencyKey: "b", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.CodeUndefinedTable, res.Run.Error.Code, "%+v", res.Run.Error)
	require.Contains(t, res.Run.Error.Message, "ratchet migrate")
	require.True(t, res.Run.Error.Retryable, "an operator may mend it")
}
