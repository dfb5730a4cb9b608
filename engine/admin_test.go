package engine_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/steps"
)

func TestCancelStopsALeasedRunAtItsNextPhaseBoundary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createCaptures(t)
	flow := registerGated(t, "A")
	c := b.client(t, flow.workflows, nil)
	done := make(chan *engine.Result[receipt], 1)
	go func() {
		res, err := flow.wf.Start(context.Background(), c, "k", order{Amount: 1}, nil)
		assertNoError(t, err)
		done <- res
	}()
	receive(t, flow.atGate)
	runID := b.runIDForKey(t, "k")

	cancelled, err := c.Cancel(context.Background(), runID)
	require.NoError(t, err)
	require.Equal(t, engine.CancelRequested, cancelled.Outcome)
	require.Equal(t, engine.StatusRunning, cancelled.Run.Status, "a live executor holds it: cancellation is requested")
	require.NotNil(t, cancelled.Run.CancelRequestedAt)

	close(flow.gate)
	res := receive(t, done)
	require.Equal(t, engine.StatusCancelled, res.Run.Status)
	require.Equal(t, engine.CodeCancelled, res.Run.Error.Code)
	require.Equal(t, 0, b.counter(t, "captured"), "the next phase did not commit")
	require.Equal(t, "reserved", res.Run.RecoveryPoint, "committed phases stay")

	_, err = c.Cancel(context.Background(), runID)
	require.ErrorIs(t, err, engine.ErrFinished)
}

func TestCancelUnleasedRunAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	wf := registerCharge(t, workflows, nil)
	c := b.client(t, workflows, nil)
	tx, err := b.pool.Begin(context.Background())
	require.NoError(t, err)
	res, err := wf.StartTx(context.Background(), c, tx, "k", order{Customer: "x"}, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(context.Background()))

	cancelled, err := c.Cancel(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.CancelledNow, cancelled.Outcome)
	run := cancelled.Run
	require.Equal(t, engine.StatusCancelled, run.Status)
	require.NotNil(t, run.FinishedAt)
	require.NotNil(t, run.ExpiresAt, "a cancelled run expires like any finished one")
	require.EqualValues(t, 1, run.LeaseToken, "a new token fences any late executor")

	_, err = c.TakeOver(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, 0, b.counter(t, "x"), "a cancelled run never executes")
}

func TestReopenRetriesAFailedRunFromItsRecoveryPoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gw := fakes.NewGateway(nil)
	srv := httptest.NewServer(gw)
	defer srv.Close()
	gwClient := &fakes.GatewayClient{BaseURL: srv.URL, HTTP: steps.NewClient(nil)}
	customer := fakes.DeclinedCustomer
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "pay2", func(ctx context.Context, _ struct{}) (string, error) {
		if _, err := engine.Atomic(ctx, "created", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "created") }, nil); err != nil {
			return "", err
		}
		ch, err := engine.Step(ctx, "charged", func(ctx context.Context, _ steps.Key) (fakes.Charge, error) {
			return gwClient.Charge(ctx, fakes.ChargeRequest{Amount: 1, Currency: "usd", Customer: customer})
		}, nil)
		return ch.ID, err
	}, &engine.WorkflowOpts{ErrorStatuses: map[string]int{"card_declined": 402}})
	require.NoError(t, err)
	c := b.client(t, workflows, nil)

	res := start(t, c, "pay2", "k")
	require.Equal(t, engine.StatusFailed, res.Run.Status)
	require.Equal(t, 402, *res.Run.ResponseStatus, "the workflow's status for its error is stored")
	require.Equal(t, "charged", res.Run.RecoveryPoint)

	_, err = c.Reopen(context.Background(), "01JNOSUCHRUN0000000000000")
	require.ErrorIs(t, err, engine.ErrRunNotFound)

	customer = "cus_ok" // the operator fixed what made it fail; the key differs from the gateway's stored decline
	run, err := c.Reopen(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, run.Status)
	require.Equal(t, "created", run.RecoveryPoint, "the failed step is tried again")
	require.Nil(t, run.ResponseStatus)

	run, err = c.TakeOver(context.Background(), res.Run.ID)
	require.NoError(t, err)
	// Same child key as the declined attempt, other parameters: the
	// gateway refuses it, which is the honest outcome of retrying a call
	// with the same key and a different body.
	require.Equal(t, engine.StatusFailed, run.Status)
	require.Equal(t, "http_400", run.Error.Code)
	require.Equal(t, 1, b.counter(t, "created"), "committed phases did not run again")

	registerCharge(t, workflows, nil)
	succeeded := start(t, c, "charge", "ok")
	require.Equal(t, engine.StatusSucceeded, succeeded.Run.Status)
	_, err = c.Reopen(context.Background(), succeeded.Run.ID)
	require.ErrorIs(t, err, engine.ErrNotFailed)
}

func TestSuccessStatusIsStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	registerCharge(t, workflows, &engine.WorkflowOpts{SuccessStatus: 200})
	c := b.client(t, workflows, nil)
	res := start(t, c, "charge", "k")
	require.Equal(t, 200, *res.Run.ResponseStatus)

	_, err := engine.Register(engine.NewWorkflows(), "bad", func(context.Context, struct{}) (int, error) { return 0, nil }, &engine.WorkflowOpts{SuccessStatus: 302})
	require.Error(t, err)
	_, err = engine.Register(engine.NewWorkflows(), "bad", func(context.Context, struct{}) (int, error) { return 0, nil }, &engine.WorkflowOpts{ErrorStatuses: map[string]int{"x": 200}})
	require.Error(t, err)
}

func TestListRunsFiltersAndPagesNewestFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	wf := registerCharge(t, workflows, nil)
	c := b.client(t, workflows, nil)
	ctx := context.Background()
	var ids []string
	for i := range 7 {
		res, err := wf.Start(ctx, c, fmt.Sprint("k", i), order{Customer: "x"}, &engine.StartOpts{Tenant: "acme"})
		require.NoError(t, err)
		ids = append([]string{res.Run.ID}, ids...) // newest first
	}
	_, err := wf.Start(ctx, c, "other-tenant", order{Customer: "x"}, nil)
	require.NoError(t, err)

	var got []string
	after := ""
	for {
		page, err := c.ListRuns(ctx, engine.ListParams{Tenant: "acme", Limit: 3, After: after})
		require.NoError(t, err)
		for _, r := range page {
			got = append(got, r.ID)
		}
		if len(page) < 3 {
			break
		}
		after = page[len(page)-1].ID
	}
	require.Equal(t, ids, got)

	byKey, err := c.ListRuns(ctx, engine.ListParams{Tenant: "acme", IdempotencyKey: "k3"})
	require.NoError(t, err)
	require.Len(t, byKey, 1)
	none, err := c.ListRuns(ctx, engine.ListParams{Tenant: "acme", Status: engine.StatusFailed})
	require.NoError(t, err)
	require.Empty(t, none)
	_, err = c.ListRuns(ctx, engine.ListParams{Limit: 501})
	require.Error(t, err)
}

func TestClaimThenExecute(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	registerCharge(t, workflows, nil)
	c := b.client(t, workflows, nil)
	ctx := context.Background()
	res, err := c.Claim(ctx, engine.StartParams{Workflow: "charge", IdempotencyKey: "k", Input: []byte(`{"customer":"x","amount":2}`)})
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeCreated, res.Outcome)
	require.Equal(t, engine.StatusRunning, res.Run.Status)
	require.Equal(t, 0, b.counter(t, "x"), "Claim executes nothing")

	again, err := c.Claim(ctx, engine.StartParams{Workflow: "charge", IdempotencyKey: "k", Input: []byte(`{"customer":"x","amount":2}`)})
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeInProgress, again.Outcome)
	_, err = c.Execute(ctx, again)
	require.Error(t, err, "only the claim that created the run executes it")

	run, err := c.Execute(ctx, res)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	require.Equal(t, 1, b.counter(t, "x"))
}

// CancelTx and ReopenTx hold if and only if the caller's transaction
// commits, together with its own writes.
func TestCancelTxAndReopenTxJoinTheCallersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "declined", func(ctx context.Context, _ struct{}) (int, error) {
		return 0, steps.Permanent("card_declined", errors.New("declined"))
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	pending := startUnleased(t, b, c, "declined", "pending")

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	cancelled, err := c.CancelTx(ctx, tx, pending.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, cancelled.Run.Status, "as the transaction sees it")
	require.NoError(t, tx.Rollback(ctx))
	run, err := c.GetRun(ctx, pending.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, run.Status, "rolled back with the caller's transaction")

	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := bump(ctx, tx, "order_cancelled"); err != nil {
			return err
		}
		_, err := c.CancelTx(ctx, tx, pending.ID)
		return err
	}))
	run, err = c.GetRun(ctx, pending.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, run.Status)
	require.Equal(t, 1, b.counter(t, "order_cancelled"))

	failed, err := c.Start(ctx, engine.StartParams{Workflow: "declined", IdempotencyKey: "failed", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, failed.Run.Status)
	tx, err = b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = c.ReopenTx(ctx, tx, failed.Run.ID)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	run, err = c.GetRun(ctx, failed.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, run.Status, "rolled back")
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := c.ReopenTx(ctx, tx, failed.Run.ID)
		return err
	}))
	run, err = c.GetRun(ctx, failed.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, run.Status, "reopened on commit")
	_, err = c.ReopenTx(ctx, nil, failed.Run.ID)
	require.Error(t, err)
}
