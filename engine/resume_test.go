package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/crashpoint"
)

// gatedFlow is a two-phase workflow whose first execution stops between
// its phases until the test opens the gate (or cancels it), so that tests
// can abandon, pause or supersede an executor at that boundary.
type gatedFlow struct {
	workflows  *engine.Workflows
	wf         *engine.Workflow[order, receipt]
	executions atomic.Int32
	atGate     chan struct{} // receives when the first execution reaches the gate
	gate       chan struct{} // closed to let the first execution continue
}

// registerGated registers the workflow in a registry of its own, as the
// process named executor would.
func registerGated(t *testing.T, executor string) *gatedFlow {
	t.Helper()
	g := &gatedFlow{workflows: engine.NewWorkflows(), atGate: make(chan struct{}, 1), gate: make(chan struct{})}
	var err error
	g.wf, err = engine.Register(g.workflows, "gated", func(ctx context.Context, in order) (receipt, error) {
		first := g.executions.Add(1) == 1
		if _, err := engine.Atomic(ctx, "reserved", func(ctx context.Context, tx pgx.Tx) (int, error) {
			return bump(ctx, tx, "reserved")
		}, nil); err != nil {
			return receipt{}, err
		}
		if first {
			g.atGate <- struct{}{}
			select {
			case <-g.gate:
			case <-ctx.Done():
				return receipt{}, context.Cause(ctx)
			}
		}
		n, err := engine.Atomic(ctx, "captured", func(ctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO captures (executor) VALUES ($1)`, executor); err != nil {
				return 0, err
			}
			return bump(ctx, tx, "captured")
		}, nil)
		if err != nil {
			return receipt{}, err
		}
		return receipt{Total: in.Amount * n, Executor: executor}, nil
	}, nil)
	require.NoError(t, err)
	return g
}

func (b *testBundle) createCaptures(t *testing.T) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), `CREATE TABLE captures (id serial PRIMARY KEY, executor text NOT NULL)`)
	require.NoError(t, err)
}

func TestResumeContinuesAbandonedRunAfterLeaseExpires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createCaptures(t)
	// Long enough that the abandoned lease is surely still live when the
	// first TakeOver asks, on a loaded machine too.
	const staleAfter = 3 * time.Second
	flowA := registerGated(t, "A")
	a := b.client(t, flowA.workflows, &engine.Config{StaleAfter: staleAfter})
	flowB := registerGated(t, "B")
	flowB.executions.Store(1) // B's code never stops at the gate
	bc := b.client(t, flowB.workflows, &engine.Config{StaleAfter: staleAfter})

	// A's process dies right after phase 1 commits; its lease stays.
	_, err := flowA.wf.Start(crashpoint.After(context.Background(), "reserved"), a, "order-1", order{Amount: 7}, nil)
	require.ErrorIs(t, err, crashpoint.ErrCrashed)

	runID := b.runIDForKey(t, "order-1")
	_, err = bc.TakeOver(context.Background(), runID)
	var held *engine.LeaseHeldError
	require.ErrorAs(t, err, &held, "the abandoned lease is still live")
	require.ErrorIs(t, err, engine.ErrLeaseHeld)

	// Wait out the lease: Resume refuses until the database's clock passes it.
	var run *engine.Run
	require.Eventually(t, func() bool {
		run, err = bc.TakeOver(context.Background(), runID)
		return !errors.Is(err, engine.ErrLeaseHeld)
	}, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, err)

	require.Equal(t, engine.StatusSucceeded, run.Status)
	require.JSONEq(t, `{"total":7,"executor":"B"}`, string(run.Output))
	require.Equal(t, 1, b.counter(t, "reserved"), "phase 1 was not run again")
	require.Equal(t, 1, b.counter(t, "captured"))
	require.EqualValues(t, 2, run.LeaseToken, "the takeover took a new token")
	require.Equal(t, 2, run.Attempt)

	phases, err := bc.Phases(context.Background(), runID)
	require.NoError(t, err)
	require.Len(t, phases, 2)
	require.Equal(t, []string{"reserved", "captured"}, []string{phases[0].Name, phases[1].Name})
}

func TestZombieCommitIsRefusedAfterTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createCaptures(t)
	flowA := registerGated(t, "A")
	a := b.client(t, flowA.workflows, nil) // heartbeats every 10s: none fire during the test
	flowB := registerGated(t, "B")
	flowB.executions.Store(1)
	bc := b.client(t, flowB.workflows, nil)

	done := make(chan error, 1)
	go func() {
		_, err := flowA.wf.Start(context.Background(), a, "order-1", order{Amount: 7}, nil)
		done <- err
	}()
	receive(t, flowA.atGate)
	runID := b.runIDForKey(t, "order-1")

	// A is paused past its lease; B takes over and finishes.
	b.expireLease(t, runID)
	run, err := bc.TakeOver(context.Background(), runID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)

	// A wakes up and tries to commit its next phase.
	close(flowA.gate)
	err = receive(t, done)
	require.ErrorIs(t, err, engine.ErrLeaseLost)

	var executors []string
	rows, err := b.pool.Query(context.Background(), `SELECT executor FROM captures ORDER BY id`)
	require.NoError(t, err)
	executors, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"B"}, executors, "A's phase rolled back: no duplicate rows")
	require.Equal(t, 1, b.counter(t, "captured"))
	require.Equal(t, 2, b.countRows(t, "phases"))

	final, err := bc.GetRun(context.Background(), runID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, final.Status)
	require.JSONEq(t, `{"total":7,"executor":"B"}`, string(final.Output), "the final state is B's")
}

func TestZombieCommitIsRefusedWhileSuccessorRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createCaptures(t)
	flowA := registerGated(t, "A")
	a := b.client(t, flowA.workflows, nil)
	flowB := registerGated(t, "B") // B stops at the gate too
	bc := b.client(t, flowB.workflows, nil)

	doneA := make(chan error, 1)
	go func() {
		_, err := flowA.wf.Start(context.Background(), a, "order-1", order{Amount: 7}, nil)
		doneA <- err
	}()
	receive(t, flowA.atGate)
	runID := b.runIDForKey(t, "order-1")
	b.expireLease(t, runID)

	doneB := make(chan error, 1)
	go func() {
		_, err := bc.TakeOver(context.Background(), runID)
		doneB <- err
	}()
	receive(t, flowB.atGate)

	// The zombie commits first, at a journal position nobody holds yet:
	// only the fencing token stops it.
	close(flowA.gate)
	require.ErrorIs(t, receive(t, doneA), engine.ErrLeaseLost)
	require.Equal(t, 0, b.counter(t, "captured"), "the zombie's phase rolled back")
	require.Equal(t, 1, b.countRows(t, "phases"))

	close(flowB.gate)
	require.NoError(t, receive(t, doneB))
	final, err := bc.GetRun(context.Background(), runID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, final.Status)
	require.JSONEq(t, `{"total":7,"executor":"B"}`, string(final.Output))
	require.Equal(t, 1, b.counter(t, "captured"))
}

func TestHeartbeatThatFindsTokenChangedCancelsExecutor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	cause := make(chan error, 1)
	inPhase := make(chan struct{}, 1)
	_, err := engine.Register(workflows, "slow", func(ctx context.Context, _ struct{}) (struct{}, error) {
		return engine.Atomic(ctx, "wait", func(ctx context.Context, _ pgx.Tx) (struct{}, error) {
			inPhase <- struct{}{}
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return struct{}{}, ctx.Err()
		}, nil)
	}, nil)
	require.NoError(t, err)
	// Heartbeats often, on a lease so long that only a heartbeat finding
	// the token changed can end the execution within the test.
	a := b.client(t, workflows, &engine.Config{StaleAfter: time.Minute, HeartbeatInterval: 20 * time.Millisecond})

	done := make(chan error, 1)
	go func() {
		_, err := a.Start(context.Background(), engine.StartParams{Workflow: "slow", IdempotencyKey: "k", Input: []byte(`{}`)})
		done <- err
	}()
	receive(t, inPhase)
	// Another executor takes over (its token replaces A's).
	_, err = b.pool.Exec(context.Background(), `UPDATE ratchet.runs SET lease_token = lease_token + 1`)
	require.NoError(t, err)

	require.ErrorIs(t, receive(t, cause), engine.ErrLeaseLost, "the executor's context is cancelled with lease lost")
	require.ErrorIs(t, receive(t, done), engine.ErrLeaseLost)
	require.Equal(t, 0, b.countRows(t, "phases"))
}

func TestNonDeterministicResumeFailsRunNamingBothPhases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createCaptures(t)
	old := registerGated(t, "A")
	a := b.client(t, old.workflows, nil)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := old.wf.Start(ctx, a, "order-1", order{Amount: 7}, nil)
		done <- err
	}()
	receive(t, old.atGate)
	cancel()
	receive(t, done)
	runID := b.runIDForKey(t, "order-1")

	// A new deployment renamed the first phase.
	changed := engine.NewWorkflows()
	ran := false
	_, err := engine.Register(changed, "gated", func(ctx context.Context, in order) (receipt, error) {
		_, err := engine.Atomic(ctx, "held", func(ctx context.Context, tx pgx.Tx) (int, error) {
			ran = true
			return 0, nil
		}, nil)
		return receipt{}, err
	}, nil)
	require.NoError(t, err)
	bc := b.client(t, changed, nil)

	b.expireLease(t, runID)
	run, err := bc.TakeOver(context.Background(), runID)
	require.NoError(t, err)
	require.False(t, ran, "the mismatching phase did not run")
	require.Equal(t, engine.StatusFailed, run.Status)
	require.Equal(t, engine.CodeNonDeterminism, run.Error.Code)
	require.False(t, run.Error.Retryable)
	require.Contains(t, run.Error.Message, `"reserved"`)
	require.Contains(t, run.Error.Message, `"held"`)
	require.Equal(t, "reserved", run.RecoveryPoint)
}

func TestWorkflowReturningBeforeJournaledPhaseIsNonDeterministic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createCaptures(t)
	old := registerGated(t, "A")
	a := b.client(t, old.workflows, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := old.wf.Start(ctx, a, "order-1", order{Amount: 7}, nil)
		done <- err
	}()
	receive(t, old.atGate)
	cancel()
	receive(t, done)
	runID := b.runIDForKey(t, "order-1")

	changed := engine.NewWorkflows()
	_, err := engine.Register(changed, "gated", func(ctx context.Context, in order) (receipt, error) {
		return receipt{}, nil // the new code has no phases at all
	}, nil)
	require.NoError(t, err)
	b.expireLease(t, runID)
	run, err := b.client(t, changed, nil).TakeOver(context.Background(), runID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, run.Status)
	require.Equal(t, engine.CodeNonDeterminism, run.Error.Code)
	require.Contains(t, run.Error.Message, `"reserved"`)
}

func TestResumeReportsFinishedHeldAndMissingRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	wf := registerCharge(t, workflows, nil)
	c := b.client(t, workflows, nil)
	ctx := context.Background()

	res, err := wf.Start(ctx, c, "k", order{Amount: 1, Customer: "x"}, nil)
	require.NoError(t, err)
	run, err := c.TakeOver(ctx, res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, res.Run, run, "a finished run is returned untouched")
	require.Equal(t, 1, b.counter(t, "x"))

	_, err = c.TakeOver(ctx, "01JNOSUCHRUN0000000000000")
	require.ErrorIs(t, err, engine.ErrRunNotFound)
}
