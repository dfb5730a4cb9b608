package engine_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/testproc"
)

// Crash tests re-run this test binary as a separate process that executes
// a workflow, and kill it with SIGKILL at a chosen moment.
func TestMain(m *testing.M) { testproc.Main(m, helperMain) }

// helperMain starts a payment and executes it inline, as a service would;
// the parent kills it part-way.
func helperMain() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	workflows := engine.NewWorkflows()
	if err := addPay(workflows, os.Getenv("GATEWAY_URL"), nil); err != nil {
		return err
	}
	c, err := engine.NewClient(pool, &engine.Config{Workflows: workflows, StaleAfter: time.Second, ID: "doomed"})
	if err != nil {
		return err
	}
	_, err = c.Start(ctx, engine.StartParams{Workflow: "pay", IdempotencyKey: os.Getenv("RATCHET_KEY"), Input: []byte(`{"amount":1299,"customer":"cus_123"}`)})
	return err
}

func TestKilledAfterChargeBeforeCommitRepeatsCallWithSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	charged := make(chan string, 1)
	release := make(chan struct{})
	var gw *fakes.Gateway
	gw = fakes.NewGateway(&fakes.GatewayOpts{AfterCharge: func(key string) {
		if gw.Stats().Charges == 1 { // hold the first charge's answer until its caller is dead
			charged <- key
			<-release
		}
	}})
	srv := httptest.NewServer(gw)
	defer srv.Close()
	defer close(release)

	victim := testproc.Start(t, "", "DATABASE_URL="+b.url, "GATEWAY_URL="+srv.URL, "RATCHET_KEY=pay-1")
	key := receive(t, charged)

	// The gateway has charged; the process has not committed the phase.
	victim.Signal(syscall.SIGKILL)
	victim.Wait()
	require.True(t, victim.Killed())

	runID := b.runIDForKey(t, "pay-1")
	require.Equal(t, 0, b.countRows(t, "phases"), "the charge was never committed")

	workflows := engine.NewWorkflows()
	registerPay(t, workflows, srv.URL, nil)
	survivor := b.client(t, workflows, nil)
	require.Equal(t, childKeyOf(t, survivor, runID, "charge_created"), key)
	var (
		run *engine.Run
		err error
	)
	require.Eventually(t, func() bool {
		run, err = survivor.TakeOver(context.Background(), runID)
		return !errors.Is(err, engine.ErrLeaseHeld)
	}, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status, "%+v", run.Error)

	stats := gw.Stats()
	require.Equal(t, 1, stats.ChargesByKey[key], "the repeated call did not charge again")
	require.Equal(t, 2, stats.RequestsByKey[key], "the call was repeated, with the same key")
	require.Equal(t, 1, stats.Charges)
	require.JSONEq(t, `{"id":"ch_000001","amount":1299,"currency":"usd","customer":"cus_123","status":"succeeded","idempotency_key":"`+key+`"}`, string(run.Output))
}
