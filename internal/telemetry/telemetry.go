// Package telemetry sets a Ratchet process's OpenTelemetry up from the
// standard OTEL_* environment variables, and gives its logs the trace they
// belong to. The library packages only use the OpenTelemetry API; this is
// what the ratchet command installs behind it.
package telemetry

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Options adjust Setup. A nil *Options is valid.
type Options struct {
	// TraceOut, if set, also receives every span as JSON (ratchet dev
	// --trace-stdout), whatever the environment says.
	TraceOut io.Writer
}

// Setup installs global tracer and meter providers as the environment asks:
//
//   - traces when OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (OTLP over gRPC or HTTP per
//     OTEL_EXPORTER_OTLP_PROTOCOL, or "console");
//   - metrics when OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set.
//
// With none of them (and no TraceOut) it installs nothing: every span and
// metric stays a no-op. The service name is OTEL_SERVICE_NAME, else
// "ratchet". The returned function flushes and shuts the providers down.
func Setup(ctx context.Context, opts *Options) (shutdown func(context.Context) error, err error) {
	if opts == nil {
		opts = &Options{}
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	var shutdowns []func(context.Context) error
	shutdown = func(ctx context.Context) error {
		var errs []error
		for _, s := range shutdowns {
			errs = append(errs, s(ctx))
		}
		return errors.Join(errs...)
	}
	if os.Getenv("OTEL_SDK_DISABLED") == "true" {
		return shutdown, nil
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", serviceName())))
	if err != nil {
		return shutdown, err
	}

	var spanOpts []sdktrace.TracerProviderOption
	if anySet("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return shutdown, err
		}
		spanOpts = append(spanOpts, sdktrace.WithBatcher(exp))
	}
	if opts.TraceOut != nil {
		exp, err := stdouttrace.New(stdouttrace.WithWriter(opts.TraceOut))
		if err != nil {
			return shutdown, err
		}
		spanOpts = append(spanOpts, sdktrace.WithSyncer(exp))
	}
	if len(spanOpts) > 0 {
		tp := sdktrace.NewTracerProvider(append(spanOpts, sdktrace.WithResource(res))...)
		otel.SetTracerProvider(tp)
		shutdowns = append(shutdowns, tp.Shutdown)
	}

	if anySet("OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") {
		reader, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			return shutdown, err
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithResource(res))
		otel.SetMeterProvider(mp)
		shutdowns = append(shutdowns, mp.Shutdown)
	}
	return shutdown, nil
}

func serviceName() string {
	if n := os.Getenv("OTEL_SERVICE_NAME"); n != "" {
		return n
	}
	return "ratchet"
}

func anySet(names ...string) bool {
	for _, n := range names {
		if os.Getenv(n) != "" {
			return true
		}
	}
	return false
}

// LogHandler adds the trace_id and span_id of a record's context to every
// record h handles, so a log line leads to its trace.
func LogHandler(h slog.Handler) slog.Handler { return traceHandler{h} }

type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(attrs)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
