package engine_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/steps"
)

type observed struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func observe(t *testing.T) *observed {
	t.Helper()
	o := &observed{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	o.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(o.spans))
	o.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(o.reader))
	return o
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func (o *observed) span(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range o.spans.Ended() {
		if s.Name() == name {
			return s
		}
	}
	t.Fatalf("no span %q", name)
	return nil
}

// sum returns the value of an int64 counter with the given attribute.
func (o *observed) sum(t *testing.T, name string, match ...attribute.KeyValue) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, o.reader.Collect(context.Background(), &rm))
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					if hasAll(dp.Attributes.ToSlice(), match) {
						total += dp.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					if hasAll(dp.Attributes.ToSlice(), match) {
						total += int64(dp.Count)
					}
				}
			}
		}
	}
	return total
}

func hasAll(have, want []attribute.KeyValue) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func TestSpansOfAPaymentFormATree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := observe(t)
	gw := fakes.NewGateway(nil)
	srv := httptest.NewServer(gw)
	defer srv.Close()
	gwClient := &fakes.GatewayClient{BaseURL: srv.URL, HTTP: steps.NewClient(&steps.TransportOpts{TracerProvider: o.tp})}
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "payment", func(ctx context.Context, in payment) (string, error) {
		if _, err := engine.Atomic(ctx, "payment_created", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "p") }, nil); err != nil {
			return "", err
		}
		ch, err := engine.Step(ctx, "charge_created", func(ctx context.Context, _ steps.Key) (fakes.Charge, error) {
			return gwClient.Charge(ctx, fakes.ChargeRequest{Amount: in.Amount, Currency: "usd", Customer: in.Customer})
		}, nil)
		if err != nil {
			return "", err
		}
		_, err = engine.Atomic(ctx, "ledger_posted", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "l") }, nil)
		return ch.ID, err
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{TracerProvider: o.tp, MeterProvider: o.mp})

	ctx, request := o.tp.Tracer("test").Start(context.Background(), "POST /payments")
	res, err := c.Start(ctx, engine.StartParams{Workflow: "payment", IdempotencyKey: "k", Input: []byte(`{"amount":5,"customer":"cus_1"}`)})
	request.End()
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, res.Run.Status)

	run := o.span(t, "ratchet.run payment")
	require.Equal(t, request.SpanContext().SpanID(), run.Parent().SpanID(), "the run span is the request's child")
	ra := attrs(run)
	require.Equal(t, res.Run.ID, ra["ratchet.run.id"].AsString())
	require.Equal(t, "payment", ra["ratchet.workflow"].AsString())
	require.EqualValues(t, 1, ra["ratchet.attempt"].AsInt64())
	require.EqualValues(t, 1, ra["ratchet.lease.token"].AsInt64())
	require.Equal(t, "succeeded", ra["ratchet.status"].AsString())
	require.Equal(t, "started", ra["ratchet.recovery_point"].AsString())

	childKey := childKey(t, res.Run, "charge_created")
	for _, p := range []struct{ name, kind string }{{"payment_created", "atomic"}, {"charge_created", "step"}, {"ledger_posted", "atomic"}} {
		s := o.span(t, "ratchet.phase "+p.name)
		require.Equal(t, run.SpanContext().SpanID(), s.Parent().SpanID(), "phase %s is the run's child", p.name)
		a := attrs(s)
		require.Equal(t, p.name, a["ratchet.phase"].AsString())
		require.Equal(t, p.kind, a["ratchet.phase.kind"].AsString())
		require.Equal(t, p.name, a["ratchet.recovery_point"].AsString())
		require.False(t, a["ratchet.replayed"].AsBool())
		require.Equal(t, res.Run.ID, a["ratchet.run.id"].AsString())
		require.EqualValues(t, 1, a["ratchet.lease.token"].AsInt64())
		if p.kind == "step" {
			require.Equal(t, childKey, a["ratchet.child_key"].AsString())
		}
	}

	// The gateway got the step's trace: its traceparent names the HTTP
	// client span under the charge phase.
	charge := o.span(t, "ratchet.phase charge_created")
	reqs := gw.Requests()
	require.Len(t, reqs, 1)
	parts := strings.Split(reqs[0].Traceparent, "-")
	require.Equal(t, charge.SpanContext().TraceID().String(), parts[1])
	var client sdktrace.ReadOnlySpan
	for _, s := range o.spans.Ended() {
		if s.SpanContext().SpanID().String() == parts[2] {
			client = s
		}
	}
	require.NotNil(t, client, "the traceparent's span is recorded")
	require.Equal(t, charge.SpanContext().SpanID(), client.Parent().SpanID())

	require.EqualValues(t, 1, o.sum(t, "ratchet.runs.started"))
	require.EqualValues(t, 1, o.sum(t, "ratchet.runs.finished", attribute.String("ratchet.status", "succeeded")))
	require.EqualValues(t, 3, o.sum(t, "ratchet.phase.duration"), "one duration per phase")
	require.EqualValues(t, 1, o.sum(t, "ratchet.phase.duration", attribute.String("ratchet.phase", "charge_created")))

	_, err = c.Start(context.Background(), engine.StartParams{Workflow: "payment", IdempotencyKey: "k", Input: []byte(`{"amount":5,"customer":"cus_1"}`)})
	require.NoError(t, err)
	require.EqualValues(t, 1, o.sum(t, "ratchet.runs.replayed", attribute.String("ratchet.outcome", "finished")))
}

func TestResumedRunLinksToTheRequestAndCountsRecoveryAndFencing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createCaptures(t)
	o := observe(t)
	flowA := registerGated(t, "A")
	a := b.client(t, flowA.workflows, &engine.Config{TracerProvider: o.tp, MeterProvider: o.mp})
	flowB := registerGated(t, "B")
	flowB.executions.Store(1)
	bc := b.client(t, flowB.workflows, &engine.Config{TracerProvider: o.tp, MeterProvider: o.mp})

	ctx, request := o.tp.Tracer("test").Start(context.Background(), "POST /orders")
	done := make(chan error, 1)
	go func() {
		_, err := flowA.wf.Start(ctx, a, "k", order{Amount: 1}, nil)
		done <- err
	}()
	receive(t, flowA.atGate)
	request.End()
	runID := b.runIDForKey(t, "k")
	b.expireLease(t, runID)

	// B resumes in a trace of its own (a worker's job).
	jobCtx, job := o.tp.Tracer("test").Start(context.Background(), "river.work")
	_, err := bc.TakeOver(jobCtx, runID)
	job.End()
	require.NoError(t, err)
	close(flowA.gate)
	require.ErrorIs(t, receive(t, done), engine.ErrLeaseLost)

	var resumed sdktrace.ReadOnlySpan
	for _, s := range o.spans.Ended() {
		if s.Name() == "ratchet.run gated" && s.SpanContext().TraceID() == job.SpanContext().TraceID() {
			resumed = s
		}
	}
	require.NotNil(t, resumed)
	require.Len(t, resumed.Links(), 1)
	require.Equal(t, request.SpanContext().TraceID(), resumed.Links()[0].SpanContext.TraceID(), "linked to the request's trace")
	require.True(t, attrs(resumed)["ratchet.resumed"].AsBool())

	// The zombie's run span records the lease loss as an error.
	var zombie sdktrace.ReadOnlySpan
	for _, s := range o.spans.Ended() {
		if s.Name() == "ratchet.run gated" && s.SpanContext().TraceID() == request.SpanContext().TraceID() {
			zombie = s
		}
	}
	require.NotNil(t, zombie)
	require.Equal(t, codes.Error, zombie.Status().Code)

	require.EqualValues(t, 1, o.sum(t, "ratchet.runs.recovered"))
	require.EqualValues(t, 1, o.sum(t, "ratchet.lease.takeovers"))
	require.EqualValues(t, 1, o.sum(t, "ratchet.lease.fencing_rejections"))
	require.EqualValues(t, 1, o.sum(t, "ratchet.phase.duration", attribute.Bool("ratchet.replayed", true)), "B replayed phase 1")
}
