package engine_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/steps"
)

type gateIn struct {
	Customer string `json:"customer"`
}

type gateInChanged struct {
	Customer int `json:"customer"` // was a string
}

// gateFlow builds the deploy gate's workflow "order", as a build would
// define it: reserve, charge, then wait for shipping. edit changes what a
// new build changed; nil is the build the runs started on.
type gateFlow struct {
	gw *fakes.GatewayClient
	// calls counts every phase function called.
	calls *int
}

type gateEdit int

const (
	asDeployed gateEdit = iota
	insertedPhase
	renamedPhase
	removedPhase
	changedOutput
	appendedPhase
	patchedChange
)

func (f gateFlow) reserve(ctx context.Context) (int, error) {
	return engine.Atomic(ctx, "reserved", func(ctx context.Context, tx pgx.Tx) (int, error) {
		*f.calls++
		return bump(ctx, tx, "reserved")
	}, nil)
}

func (f gateFlow) charge(ctx context.Context, name, customer string) (fakes.Charge, error) {
	return engine.Step(ctx, name, func(ctx context.Context, _ steps.Key) (fakes.Charge, error) {
		*f.calls++
		return f.gw.Charge(ctx, fakes.ChargeRequest{Amount: 100, Currency: "usd", Customer: customer})
	}, nil)
}

func (f gateFlow) register(t *testing.T, w *engine.Workflows, edit gateEdit) {
	t.Helper()
	_, err := engine.Register(w, "order", func(ctx context.Context, in gateIn) (string, error) {
		if _, err := f.reserve(ctx); err != nil {
			return "", err
		}
		if edit == insertedPhase {
			if _, err := engine.Atomic(ctx, "fraud_checked", func(context.Context, pgx.Tx) (int, error) { *f.calls++; return 0, nil }, nil); err != nil {
				return "", err
			}
		}
		if edit == patchedChange && engine.Patched(ctx, "fraud-check") {
			if _, err := engine.Atomic(ctx, "fraud_checked", func(context.Context, pgx.Tx) (int, error) { *f.calls++; return 0, nil }, nil); err != nil {
				return "", err
			}
		}
		switch edit {
		case renamedPhase:
			if _, err := f.charge(ctx, "charge_made", in.Customer); err != nil {
				return "", err
			}
		case changedOutput:
			if _, err := engine.Step(ctx, "charged", func(context.Context, steps.Key) (int, error) { *f.calls++; return 0, nil }, nil); err != nil {
				return "", err
			}
		case removedPhase:
		default:
			if _, err := f.charge(ctx, "charged", in.Customer); err != nil {
				return "", err
			}
		}
		if _, err := engine.Await[string](ctx, "shipped", nil); err != nil {
			return "", err
		}
		if edit == appendedPhase {
			if _, err := engine.Atomic(ctx, "notified", func(context.Context, pgx.Tx) (int, error) { *f.calls++; return 0, nil }, nil); err != nil {
				return "", err
			}
		}
		return "done", nil
	}, nil)
	require.NoError(t, err)
}

// rowCounts is every Ratchet table's row count and newest change: what a
// gate that writes nothing leaves as it found.
func (b *testBundle) rowCounts(t *testing.T) string {
	t.Helper()
	var s string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT concat_ws(' ',
		(SELECT count(*) FROM ratchet.runs), (SELECT max(updated_at) FROM ratchet.runs),
		(SELECT count(*) FROM ratchet.phases), (SELECT count(*) FROM ratchet.signals),
		(SELECT count(*) FROM ratchet.processes), (SELECT count(*) FROM ratchet.river_job),
		(SELECT coalesce(sum(n), 0) FROM counters))`).Scan(&s))
	return s
}

func TestTheDeployGate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		build     func(f gateFlow, t *testing.T) *engine.Workflows
		verdict   engine.Verdict
		seq       int
		journaled string
		called    string
	}{
		{name: "an unchanged build passes", verdict: engine.VerdictCompatible, build: edited(asDeployed)},
		{name: "an appended phase passes", verdict: engine.VerdictCompatible, build: edited(appendedPhase)},
		{name: "a patched change passes", verdict: engine.VerdictCompatible, build: edited(patchedChange)},
		{name: "an inserted phase is caught", verdict: engine.VerdictIncompatible, build: edited(insertedPhase), seq: 1, journaled: "charged", called: "fraud_checked"},
		{name: "a renamed phase is caught", verdict: engine.VerdictIncompatible, build: edited(renamedPhase), seq: 1, journaled: "charged", called: "charge_made"},
		{name: "a removed phase is caught", verdict: engine.VerdictIncompatible, build: edited(removedPhase), seq: 1, journaled: "charged", called: "shipped"},
		{name: "an output that no longer decodes is caught", verdict: engine.VerdictIncompatible, build: edited(changedOutput), seq: 1, journaled: "charged"},
		{name: "an input that no longer decodes is caught", verdict: engine.VerdictIncompatible, build: func(f gateFlow, t *testing.T) *engine.Workflows {
			w := engine.NewWorkflows()
			_, err := engine.Register(w, "order", func(ctx context.Context, in gateInChanged) (string, error) { return "", nil }, nil)
			require.NoError(t, err)
			return w
		}},
		{name: "a missing version is caught", verdict: engine.VerdictUnregistered, build: func(f gateFlow, t *testing.T) *engine.Workflows {
			w := engine.NewWorkflows()
			_, err := engine.Register(w, "order", func(ctx context.Context, in gateIn) (string, error) { return "", nil }, &engine.WorkflowOpts{Version: 2})
			require.NoError(t, err)
			return w
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			gateway := fakes.NewGateway(nil)
			srv := httptest.NewServer(gateway)
			t.Cleanup(srv.Close)
			calls := 0
			f := gateFlow{gw: &fakes.GatewayClient{BaseURL: srv.URL, HTTP: steps.NewClient(nil)}, calls: &calls}
			ctx := context.Background()

			deployed := engine.NewWorkflows()
			f.register(t, deployed, asDeployed)
			res, err := b.client(t, deployed, nil).Start(ctx, engine.StartParams{Workflow: "order", IdempotencyKey: "k", Input: []byte(`{"customer": "cus_1"}`)})
			require.NoError(t, err)
			require.Equal(t, engine.StatusWaiting, res.Run.Status, "in flight: reserved, charged, waiting to ship")
			callsBefore, statsBefore, rowsBefore := calls, gateway.Stats(), b.rowCounts(t)

			report, err := b.client(t, tc.build(f, t), nil).CheckDeploy(ctx, nil)
			require.NoError(t, err)
			require.Equal(t, 1, report.Checked)
			require.Equal(t, map[string]int{"order@1": 1}, report.InFlight)
			require.Equal(t, tc.verdict == engine.VerdictCompatible, report.OK())
			if tc.verdict == engine.VerdictCompatible {
				require.Equal(t, 1, report.Compatible)
				require.Empty(t, report.Problems)
			} else {
				require.Len(t, report.Problems, 1)
				p := report.Problems[0]
				require.Equal(t, tc.verdict, p.Verdict)
				require.Equal(t, res.Run.ID, p.RunID)
				require.NotEmpty(t, p.Reason)
				if tc.journaled != "" {
					require.NotNil(t, p.Seq, p.Reason)
					require.Equal(t, tc.seq, *p.Seq, p.Reason)
					require.Equal(t, tc.journaled, p.Journaled, p.Reason)
					require.Equal(t, tc.called, p.Called, p.Reason)
				}
				t.Logf("%s: %s", p.Verdict, p.Reason)
			}

			require.Equal(t, callsBefore, calls, "no phase function was called")
			require.Equal(t, statsBefore, gateway.Stats(), "the gateway saw nothing")
			require.Equal(t, rowsBefore, b.rowCounts(t), "nothing was written")
		})
	}
}

func edited(edit gateEdit) func(f gateFlow, t *testing.T) *engine.Workflows {
	return func(f gateFlow, t *testing.T) *engine.Workflows {
		w := engine.NewWorkflows()
		f.register(t, w, edit)
		return w
	}
}

// Runs of every kind in flight, and finished ones the gate leaves alone.
func TestTheDeployGateChecksEveryUnfinishedRunAndNoFinishedOne(t *testing.T) {
	t.Parallel()
	b := setupSaga(t, nil)
	ctx := context.Background()
	b.gateway.SetFaults(fakes.Faults{RefuseRefunds: true})
	stuck := b.start(t, ctx, "stuck", sagaOrder{Customer: "cus_1", RefuseLedger: true}) // compensating, parked
	require.Equal(t, engine.StatusCompensating, stuck.Status)
	b.gateway.SetFaults(fakes.Faults{})
	waiting := b.start(t, ctx, "waiting", sagaOrder{Customer: "cus_1", AwaitShipped: true})
	require.Equal(t, engine.StatusWaiting, waiting.Status)
	done := b.start(t, ctx, "done", sagaOrder{Customer: "cus_1"})
	require.Equal(t, engine.StatusSucceeded, done.Status)

	report, err := b.c.CheckDeploy(ctx, &engine.CheckDeployOpts{Concurrency: 1})
	require.NoError(t, err)
	require.Equal(t, 2, report.Checked)
	require.True(t, report.OK(), "%+v", report.Problems)

	// A build whose refund is gone cannot finish the stuck compensation.
	workflows := engine.NewWorkflows()
	_, err = engine.Register(workflows, "order", func(ctx context.Context, in sagaOrder) (string, error) {
		if _, err := engine.Atomic(ctx, "stock_reserved", func(context.Context, pgx.Tx) (int, error) { return 0, nil },
			&engine.AtomicOpts[int]{Compensate: func(context.Context, pgx.Tx, int) error { return nil }}); err != nil {
			return "", err
		}
		if _, err := engine.Step(ctx, "charge_created", func(context.Context, steps.Key) (fakes.Charge, error) { return fakes.Charge{}, nil }, nil); err != nil {
			return "", err
		}
		_, err := engine.Atomic(ctx, "ledger_posted", func(context.Context, pgx.Tx) (int, error) { return 0, nil }, &engine.AtomicOpts[int]{Pivot: true})
		if err != nil {
			return "", err
		}
		_, err = engine.Await[string](ctx, "shipped", nil)
		return "", err
	}, nil)
	require.NoError(t, err)
	report, err = b.client(t, workflows, nil).CheckDeploy(ctx, nil)
	require.NoError(t, err)
	require.False(t, report.OK())
	require.Equal(t, 1, report.Incompatible)
	require.Equal(t, stuck.ID, report.Problems[0].RunID)
	require.Contains(t, report.Problems[0].Reason, `"charge_created"`)
}
