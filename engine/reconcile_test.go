package engine_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/steps"
)

type reconcileBundle struct {
	*testBundle
	gateway *fakes.Gateway
	gw      *fakes.GatewayClient
}

func setupReconcile(t *testing.T, opts *fakes.GatewayOpts) *reconcileBundle {
	t.Helper()
	b := &reconcileBundle{testBundle: setup(t), gateway: fakes.NewGateway(opts)}
	srv := httptest.NewServer(b.gateway)
	t.Cleanup(srv.Close)
	b.gw = &fakes.GatewayClient{BaseURL: srv.URL, HTTP: steps.NewClient(nil)}
	return b
}

// register adds "pay": one charge step with opts, retried by the run an
// hour later (the tests take the run over themselves).
func (b *reconcileBundle) register(t *testing.T, opts *engine.StepOpts[fakes.Charge]) *engine.Client {
	t.Helper()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "pay", func(ctx context.Context, _ struct{}) (string, error) {
		ch, err := engine.Step(ctx, "charge_created", func(ctx context.Context, _ steps.Key) (fakes.Charge, error) {
			return b.gw.Charge(ctx, fakes.ChargeRequest{Amount: 500, Currency: "usd", Customer: "cus_1"})
		}, opts)
		return ch.ID, err
	}, &engine.WorkflowOpts{Retry: &engine.RetryPolicy{InitialInterval: time.Hour, MaxInterval: time.Hour}})
	require.NoError(t, err)
	return b.client(t, workflows, nil)
}

func (b *reconcileBundle) reconcile(ctx context.Context, key steps.Key) (fakes.Charge, bool, error) {
	return b.gw.FindCharge(ctx, key)
}

// An answer lost after the gateway charged: the step asks the gateway
// instead of sending the charge again, and commits what it finds.
func TestAnIndeterminateChargeIsReconciledNotRepeated(t *testing.T) {
	t.Parallel()
	b := setupReconcile(t, &fakes.GatewayOpts{Faults: fakes.Faults{DropAfter: 1}})
	c := b.register(t, &engine.StepOpts[fakes.Charge]{Policy: &fastRetries, Reconcile: b.reconcile})
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: "pay", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, res.Run.Status)
	require.JSONEq(t, `"ch_000001"`, string(res.Run.Output), "the reconciled charge is the step's output")

	key := childKey(t, res.Run, "charge_created")
	stats := b.gateway.Stats()
	require.Equal(t, 1, stats.RequestsByKey[key], "zero second calls")
	require.Equal(t, 1, stats.Charges)
	require.Equal(t, 1, stats.ReconcileQueries)
	phases, err := c.Phases(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, 2, phases[0].Attempts, "the call, then the reconciliation")
}

// The charge may have reached the gateway, whose key window is 2 seconds,
// 3 seconds before the run is resumed: the three ways of resuming it.
func TestAResumePastTheKeyWindowReconcilesOrParksButNeverRepeatsBlindly(t *testing.T) {
	t.Parallel()
	const window = 2 * time.Second
	cases := []struct {
		name string
		opts func(b *reconcileBundle) *engine.StepOpts[fakes.Charge]
		want func(t *testing.T, b *reconcileBundle, run *engine.Run)
	}{{
		name: "without Reconcile it parks for an operator",
		opts: func(*reconcileBundle) *engine.StepOpts[fakes.Charge] {
			return &engine.StepOpts[fakes.Charge]{Policy: &steps.Policy{MaxAttempts: 1}, KeyWindow: window}
		},
		want: func(t *testing.T, b *reconcileBundle, run *engine.Run) {
			require.Equal(t, engine.StatusWaiting, run.Status)
			w := run.WaitingFor
			require.Equal(t, engine.KindReconcile, w.Kind)
			require.Equal(t, "charge_created", w.Phase)
			require.Equal(t, childKey(t, run, "charge_created"), w.ChildKey)
			require.Equal(t, window, w.KeyWindow)
			require.NotNil(t, w.FirstAttempt)
			// The earliest it could have been sent: no earlier than the
			// run's creation, and before it parked.
			require.False(t, w.FirstAttempt.Before(run.CreatedAt), "first attempt %s, created %s", *w.FirstAttempt, run.CreatedAt)
			require.True(t, w.FirstAttempt.Before(run.UpdatedAt), "first attempt %s, parked %s", *w.FirstAttempt, run.UpdatedAt)
			require.NotEmpty(t, w.Reason)
			require.Nil(t, run.DueAt, "nothing wakes it but an operator")
			require.Equal(t, 1, b.gateway.Stats().Charges, "zero new charges")
		},
	}, {
		name: "with Reconcile it finds the charge",
		opts: func(b *reconcileBundle) *engine.StepOpts[fakes.Charge] {
			return &engine.StepOpts[fakes.Charge]{Policy: &steps.Policy{MaxAttempts: 1}, KeyWindow: window, Reconcile: b.reconcile, RepeatUnknown: true}
		},
		want: func(t *testing.T, b *reconcileBundle, run *engine.Run) {
			require.Equal(t, engine.StatusSucceeded, run.Status)
			require.JSONEq(t, `"ch_000001"`, string(run.Output))
			require.Equal(t, 1, b.gateway.Stats().Charges, "zero new charges")
		},
	}, {
		name: "a blind repeat, for contrast, charges twice",
		opts: func(*reconcileBundle) *engine.StepOpts[fakes.Charge] {
			// No window declared: the engine trusts the key, which the
			// gateway has forgotten.
			return &engine.StepOpts[fakes.Charge]{Policy: &steps.Policy{MaxAttempts: 1}}
		},
		want: func(t *testing.T, b *reconcileBundle, run *engine.Run) {
			require.Equal(t, engine.StatusSucceeded, run.Status)
			require.JSONEq(t, `"ch_000002"`, string(run.Output))
			key := childKey(t, run, "charge_created")
			require.Equal(t, 2, b.gateway.Stats().ChargesByKey[key], "the danger is real: one key, two charges")
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupReconcile(t, &fakes.GatewayOpts{KeyWindow: window, Faults: fakes.Faults{DropAfter: 1}})
			c := b.register(t, tc.opts(b))
			ctx := context.Background()
			res, err := c.Start(ctx, engine.StartParams{Workflow: "pay", IdempotencyKey: "k", Input: []byte(`{}`)})
			require.NoError(t, err)
			require.Equal(t, engine.StatusPending, res.Run.Status, "charged, the answer lost: released to retry")
			require.Equal(t, 1, b.gateway.Stats().Charges)

			time.Sleep(window + time.Second) // the time a slow retry takes: past the gateway's memory of the key
			run, err := c.TakeOver(ctx, res.Run.ID)
			require.NoError(t, err)
			tc.want(t, b, run)
		})
	}
}

// An operator who has checked that the effect did not happen resumes the
// parked run: the step is called again, once.
func TestAnOperatorResumesARunParkedForReconciliation(t *testing.T) {
	t.Parallel()
	b := setupReconcile(t, nil)
	var lost atomic.Bool
	lost.Store(true)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "pay", func(ctx context.Context, _ struct{}) (string, error) {
		ch, err := engine.Step(ctx, "charge_created", func(ctx context.Context, _ steps.Key) (fakes.Charge, error) {
			if lost.Swap(false) { // the request never left: nobody can know that
				return fakes.Charge{}, &steps.IndeterminateError{Err: errors.New("connection reset")}
			}
			return b.gw.Charge(ctx, fakes.ChargeRequest{Amount: 500, Currency: "usd", Customer: "cus_1"})
		}, &engine.StepOpts[fakes.Charge]{
			// Retries come every 250 ms; an attempt may take 100 ms; the
			// downstream remembers keys for 300 ms: the first retry may
			// already be past it.
			Policy:  &steps.Policy{InitialInterval: 250 * time.Millisecond, Jitter: -1, MaxAttempts: 3},
			Timeout: 100 * time.Millisecond, KeyWindow: 300 * time.Millisecond,
		})
		return ch.ID, err
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	ctx := context.Background()
	res, err := c.Start(ctx, engine.StartParams{Workflow: "pay", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, res.Run.Status, "a retry inside the execution is judged by the window too")
	require.Equal(t, engine.KindReconcile, res.Run.WaitingFor.Kind)
	require.Zero(t, b.gateway.Stats().Charges)

	_, err = c.TakeOver(ctx, res.Run.ID)
	require.NoError(t, err)
	again, err := c.GetRun(ctx, res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, again.Status, "taken over without an operator, it parks again")

	reopened, err := c.Reopen(ctx, res.Run.ID)
	require.NoError(t, err)
	require.True(t, reopened.WaitingFor.Resolved)
	run, err := c.TakeOver(ctx, res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	require.Equal(t, 1, b.gateway.Stats().Charges)
}
