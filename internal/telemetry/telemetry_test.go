package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ratchet-run/ratchet/internal/telemetry"
)

// These tests set process-wide providers and environment: not parallel.

func TestWithoutOTELVariablesNothingIsInstalled(t *testing.T) {
	for _, v := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		t.Setenv(v, "")
	}
	before := otel.GetTracerProvider()
	shutdown, err := telemetry.Setup(context.Background(), nil)
	require.NoError(t, err)
	require.NoError(t, shutdown(context.Background()))
	require.Same(t, before, otel.GetTracerProvider(), "the global provider is left alone")
}

func TestTraceOutPrintsSpans(t *testing.T) {
	var out bytes.Buffer
	shutdown, err := telemetry.Setup(context.Background(), &telemetry.Options{TraceOut: &out})
	require.NoError(t, err)
	_, span := otel.Tracer("test").Start(context.Background(), "ratchet.run payment")
	span.End()
	require.NoError(t, shutdown(context.Background()))
	var printed struct{ Name string }
	require.NoError(t, json.NewDecoder(&out).Decode(&printed))
	require.Equal(t, "ratchet.run payment", printed.Name)
}

func TestOTLPExporterIsChosenByTheEnvironment(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	before := otel.GetTracerProvider()
	shutdown, err := telemetry.Setup(context.Background(), nil)
	require.NoError(t, err)
	_, isSDK := otel.GetTracerProvider().(*sdktrace.TracerProvider)
	require.True(t, isSDK, "spans are exported")
	require.NotSame(t, before, otel.GetTracerProvider(), "by a provider this call installed")
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	_ = shutdown(ctx) // nothing listens; do not wait for it
}

func TestLogsCarryTheirTrace(t *testing.T) {
	var out bytes.Buffer
	logger := slog.New(telemetry.LogHandler(slog.NewJSONHandler(&out, nil)))
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "x")
	logger.With(slog.String("run_id", "r1")).InfoContext(ctx, "phase committed")
	span.End()
	var line map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &line))
	require.Equal(t, span.SpanContext().TraceID().String(), line["trace_id"])
	require.Equal(t, "r1", line["run_id"])
}
