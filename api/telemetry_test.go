package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ratchet-run/ratchet/api"
)

func TestRequestsContinueTheirTraceAndCountConflicts(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewSpanRecorder()
	reader := sdkmetric.NewManualReader()
	b := setup(t, &api.Config{
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
	})
	const incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	r := b.start(t, "echo", "k1", `{"value":"a"}`, "Traceparent", incoming)
	require.Equal(t, http.StatusCreated, r.status)

	var stored string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT traceparent FROM ratchet.runs WHERE idempotency_key = 'k1'`).Scan(&stored))
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", strings.Split(stored, "-")[1], "the run keeps the request's trace, for resumed executions to link to")
	var server sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == "POST /v1/workflows/{workflow}/runs" {
			server = s
		}
	}
	require.NotNil(t, server, "a span named by route, not by path")
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", server.SpanContext().TraceID().String())
	require.Equal(t, "00f067aa0ba902b7", server.Parent().SpanID().String())

	b.start(t, "echo", "k1", `{"value":"b"}`) // 422
	b.start(t, "slow", "s1", `{"value":"x"}`, "Prefer", "wait=0")
	b.start(t, "slow", "s1", `{"value":"x"}`) // 409
	b.start(t, "slow", "s1", `{"value":"x"}`) // 409

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	counts := map[int64]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "ratchet.api.responses" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := dp.Attributes.Value(attribute.Key("http.response.status_code"))
				counts[v.AsInt64()] += dp.Value
			}
		}
	}
	require.EqualValues(t, 1, counts[422])
	require.EqualValues(t, 2, counts[409])
	require.EqualValues(t, 1, counts[201])
	require.EqualValues(t, 1, counts[202])
}
