package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/steps"
)

// fastRetries keeps step retries quick in tests.
var fastRetries = steps.Policy{InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond, MaxAttempts: 5}

type payment struct {
	Amount   int64  `json:"amount"`
	Customer string `json:"customer"`
}

// registerPay registers a workflow with one external step that charges the
// gateway at gatewayURL. tp may be nil (the global tracer provider).
func registerPay(t testing.TB, workflows *engine.Workflows, gatewayURL string, tp trace.TracerProvider) {
	t.Helper()
	if err := addPay(workflows, gatewayURL, tp); err != nil {
		t.Fatal(err)
	}
}

func addPay(workflows *engine.Workflows, gatewayURL string, tp trace.TracerProvider) error {
	gw := &fakes.GatewayClient{BaseURL: gatewayURL, HTTP: steps.NewClient(&steps.TransportOpts{TracerProvider: tp})}
	_, err := engine.Register(workflows, "pay", func(ctx context.Context, in payment) (fakes.Charge, error) {
		return engine.Step(ctx, "charge_created", func(ctx context.Context, _ steps.Key) (fakes.Charge, error) {
			return gw.Charge(ctx, fakes.ChargeRequest{Amount: in.Amount, Currency: "usd", Customer: in.Customer})
		}, nil)
	}, nil)
	return err
}

func startPay(t *testing.T, ctx context.Context, c *engine.Client, key string, in payment) *engine.StartResult {
	t.Helper()
	input, err := json.Marshal(in)
	require.NoError(t, err)
	res, err := c.Start(ctx, engine.StartParams{Workflow: "pay", IdempotencyKey: key, Input: input})
	require.NoError(t, err)
	return res
}

func TestStepSurvivesDroppedResponsesWithOneCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gw := fakes.NewGateway(&fakes.GatewayOpts{Faults: fakes.Faults{DropAfter: 2}})
	srv := httptest.NewServer(gw)
	defer srv.Close()
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background()) //nolint:errcheck

	workflows := engine.NewWorkflows()
	registerPay(t, workflows, srv.URL, tp)
	c := b.client(t, workflows, &engine.Config{StepPolicy: fastRetries})

	ctx, span := tp.Tracer("test").Start(context.Background(), "POST /payments")
	res := startPay(t, ctx, c, "pay-1", payment{Amount: 1299, Customer: "cus_123"})
	span.End()
	require.Equal(t, engine.StatusSucceeded, res.Run.Status, "error: %+v", res.Run.Error)

	key := steps.Key(childKey(t, res.Run, "charge_created"))
	stats := gw.Stats()
	require.Equal(t, 1, stats.Charges, "exactly one charge")
	require.Equal(t, map[string]int{string(key): 1}, stats.ChargesByKey)
	require.Equal(t, 3, stats.RequestsByKey[string(key)])

	phases, err := c.Phases(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.Len(t, phases, 1)
	require.Equal(t, engine.KindStep, phases[0].Kind)
	require.Equal(t, 3, phases[0].Attempts, "the journal records the three attempts")
	require.Equal(t, string(key), *phases[0].ChildKey)

	for _, r := range gw.Requests() {
		require.Equal(t, string(key), r.IdempotencyKey, "every attempt sends the child key")
		parts := strings.Split(r.Traceparent, "-")
		require.Len(t, parts, 4, "traceparent %q", r.Traceparent)
		require.Equal(t, span.SpanContext().TraceID().String(), parts[1], "and continues the request's trace")
	}
}

func TestDeclinedStepFailsRunAndReplaysWithoutCallingAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gw := fakes.NewGateway(nil)
	srv := httptest.NewServer(gw)
	defer srv.Close()
	workflows := engine.NewWorkflows()
	registerPay(t, workflows, srv.URL, nil)
	c := b.client(t, workflows, &engine.Config{StepPolicy: fastRetries})

	in := payment{Amount: 500, Customer: fakes.DeclinedCustomer}
	res := startPay(t, context.Background(), c, "pay-1", in)
	require.Equal(t, engine.StatusFailed, res.Run.Status)
	require.Equal(t, &engine.RunError{Code: "card_declined", Message: "the card was declined"}, res.Run.Error)
	require.Len(t, gw.Requests(), 1, "a decline is not retried")

	again := startPay(t, context.Background(), c, "pay-1", in)
	require.Equal(t, engine.OutcomeFinished, again.Outcome)
	require.Equal(t, res.Run.Error, again.Run.Error)
	require.Len(t, gw.Requests(), 1, "the replay did not call the gateway")

	phases, err := c.Phases(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.Len(t, phases, 1, "the permanent failure is journaled")
	require.Equal(t, "card_declined", phases[0].Error.Code)
	require.Nil(t, phases[0].Output)
}

func TestStepRetriesExhaustedLeaveRunResumable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gw := fakes.NewGateway(&fakes.GatewayOpts{Faults: fakes.Faults{FailBefore: 7}})
	srv := httptest.NewServer(gw)
	defer srv.Close()
	workflows := engine.NewWorkflows()
	registerPay(t, workflows, srv.URL, nil)
	c := b.client(t, workflows, &engine.Config{StepPolicy: fastRetries, Retry: constantRetry(0)})

	res := startPay(t, context.Background(), c, "pay-1", payment{Amount: 1, Customer: "cus_123"})
	require.Equal(t, engine.StatusPending, res.Run.Status, "unfinished, not failed")
	require.Equal(t, engine.CodeStepExhausted, res.Run.Error.Code)
	require.True(t, res.Run.Error.Retryable)
	require.Len(t, gw.Requests(), 5)
	require.Equal(t, 0, b.countRows(t, "phases"))

	// The gateway recovers (requests 6 and 7 still fail, then it answers):
	// resuming finishes the run with the same key and a single charge.
	run, err := c.TakeOver(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	require.Equal(t, 1, gw.Stats().Charges)
	key := childKey(t, res.Run, "charge_created")
	require.Equal(t, 8, gw.Stats().RequestsByKey[key])
}

func TestStepTimeoutIsIndeterminateAndRetriedWithSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gw := fakes.NewGateway(nil)
	srv := httptest.NewServer(gw)
	defer srv.Close()
	gwClient := &fakes.GatewayClient{BaseURL: srv.URL, HTTP: steps.NewClient(nil)}
	workflows := engine.NewWorkflows()
	attempt := 0
	_, err := engine.Register(workflows, "slowpay", func(ctx context.Context, in payment) (fakes.Charge, error) {
		return engine.Step(ctx, "charge_created", func(ctx context.Context, _ steps.Key) (fakes.Charge, error) {
			attempt++
			if attempt == 1 {
				// The gateway takes longer than the step's timeout, but charges.
				ctx = fakes.WithFault(ctx, "latency=300ms")
			}
			return gwClient.Charge(ctx, fakes.ChargeRequest{Amount: in.Amount, Currency: "usd", Customer: in.Customer})
		}, &engine.StepOpts[fakes.Charge]{Timeout: 100 * time.Millisecond})
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{StepPolicy: steps.Policy{InitialInterval: 400 * time.Millisecond, Jitter: -1}})

	res, err := c.Start(context.Background(), engine.StartParams{Workflow: "slowpay", IdempotencyKey: "k", Input: []byte(`{"amount":5,"customer":"cus_1"}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, res.Run.Status, "%+v", res.Run.Error)
	require.Equal(t, 1, gw.Stats().Charges, "the timed-out attempt's charge is the one replayed")
	phases, err := c.Phases(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.GreaterOrEqual(t, phases[0].Attempts, 2, "the timed-out attempt was retried")
}

// A client of key format 2 creates runs whose steps send keys that name
// the run, and the listing finds the run by such a key through its id. A
// run keeps the format it was created with, whichever client executes it.
func TestChildKeyFormatIsTheRunsOwn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gw := fakes.NewGateway(nil)
	srv := httptest.NewServer(gw)
	defer srv.Close()
	workflows := engine.NewWorkflows()
	registerPay(t, workflows, srv.URL, nil)
	v1 := b.client(t, workflows, &engine.Config{KeyFormat: 1})
	v2 := b.client(t, workflows, &engine.Config{KeyFormat: 2})
	ctx := context.Background()

	res := startPay(t, ctx, v2, "pay-v2", payment{Amount: 100, Customer: "cus_1"})
	require.Equal(t, engine.StatusSucceeded, res.Run.Status)
	require.Equal(t, 2, res.Run.KeyFormat)
	key, err := steps.ChildKeyV2(engine.DefaultTenant, res.Run.ID, "charge_created")
	require.NoError(t, err)
	require.Equal(t, 1, gw.Stats().ChargesByKey[string(key)], "charged once, with the key that names the run")
	listed, err := v2.ListRuns(ctx, engine.ListParams{ChildKey: string(key)})
	require.NoError(t, err)
	require.Len(t, listed, 1)
	require.Equal(t, res.Run.ID, listed[0].ID)
	listed, err = v2.ListRuns(ctx, engine.ListParams{ChildKey: string(key.Nth(1))})
	require.NoError(t, err)
	require.Empty(t, listed, "a key the run never journaled finds nothing")

	// Created by a client of format 1 whose executor died at once; taken
	// over by the client of format 2: the key is still of format 1.
	input, err := json.Marshal(payment{Amount: 200, Customer: "cus_2"})
	require.NoError(t, err)
	claimed, err := v1.Claim(ctx, engine.StartParams{Workflow: "pay", IdempotencyKey: "pay-v1", Input: input})
	require.NoError(t, err)
	require.Equal(t, 1, claimed.Run.KeyFormat)
	b.expireLease(t, claimed.Run.ID)
	run, err := v2.TakeOver(ctx, claimed.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	old := steps.Key(childKey(t, run, "charge_created"))
	require.Equal(t, 1, gw.Stats().ChargesByKey[string(old)])
	listed, err = v2.ListRuns(ctx, engine.ListParams{ChildKey: string(old)})
	require.NoError(t, err)
	require.Len(t, listed, 1)
	require.Equal(t, run.ID, listed[0].ID)

	_, err = engine.NewClient(b.pool, &engine.Config{Workflows: workflows, KeyFormat: 4})
	require.ErrorContains(t, err, "KeyFormat 4")
}

// A failover to a standby that had not received a run's commits loses the
// run, with whatever it did: the client, told nothing or told it
// succeeded, sends its request again and a new run (a new id) executes it.
// Keys of format 3 name the request, so the new run's charge is the lost
// one's, replayed by the gateway; keys of format 2 name the run, so the
// gateway charges again. The listing finds the new run by a key of format
// 3 through its request's digest.
func TestRequestKeysMakeARetryOfALostRunTheSameCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gw := fakes.NewGateway(nil)
	srv := httptest.NewServer(gw)
	defer srv.Close()
	workflows := engine.NewWorkflows()
	registerPay(t, workflows, srv.URL, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		format     int
		newCharges int
	}{{3, 0}, {2, 1}} {
		c := b.client(t, workflows, &engine.Config{KeyFormat: tc.format})
		idem := fmt.Sprintf("pay-lost-%d", tc.format)
		first := startPay(t, ctx, c, idem, payment{Amount: 100, Customer: "cus_1"})
		require.Equal(t, engine.StatusSucceeded, first.Run.Status)
		require.Equal(t, tc.format, first.Run.KeyFormat)
		charges := gw.Stats().Charges

		// The failover: the run and its journal are gone.
		_, err := b.pool.Exec(ctx, `DELETE FROM ratchet.runs WHERE id = $1`, first.Run.ID)
		require.NoError(t, err)
		again := startPay(t, ctx, c, idem, payment{Amount: 100, Customer: "cus_1"})
		require.Equal(t, engine.StatusSucceeded, again.Run.Status)
		require.NotEqual(t, first.Run.ID, again.Run.ID, "a new run")
		require.Equal(t, charges+tc.newCharges, gw.Stats().Charges, "format %d", tc.format)

		if tc.format == 3 {
			key := steps.ChildKeyV3(engine.DefaultTenant, idem, "charge_created")
			require.Equal(t, 1, gw.Stats().ChargesByKey[string(key)], "charged once, with the key that names the request")
			phases, err := c.Phases(ctx, again.Run.ID)
			require.NoError(t, err)
			require.Equal(t, string(key), *phases[0].ChildKey)
			listed, err := c.ListRuns(ctx, engine.ListParams{ChildKey: string(key)})
			require.NoError(t, err)
			require.Len(t, listed, 1)
			require.Equal(t, again.Run.ID, listed[0].ID)
			listed, err = c.ListRuns(ctx, engine.ListParams{ChildKey: string(key.Nth(1))})
			require.NoError(t, err)
			require.Empty(t, listed, "a key the run never journaled finds nothing")
			listed, err = c.ListRuns(ctx, engine.ListParams{Tenant: "other", ChildKey: string(key)})
			require.NoError(t, err)
			require.Empty(t, listed, "nor does another tenant's listing")
		}
	}
}
