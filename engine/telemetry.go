package engine

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// instrumentation is the name of the engine's tracer and meter.
const instrumentation = "github.com/ratchet-run/ratchet/engine"

// Span attribute keys (docs/observability.md).
const (
	attrRunID         = attribute.Key("ratchet.run.id")
	attrWorkflow      = attribute.Key("ratchet.workflow")
	attrPhase         = attribute.Key("ratchet.phase")
	attrPhaseKind     = attribute.Key("ratchet.phase.kind")
	attrRecoveryPoint = attribute.Key("ratchet.recovery_point")
	attrLeaseToken    = attribute.Key("ratchet.lease.token")
	attrChildKey      = attribute.Key("ratchet.child_key")
	attrAttempt       = attribute.Key("ratchet.attempt")
	attrReplayed      = attribute.Key("ratchet.replayed")
	attrResumed       = attribute.Key("ratchet.resumed")
	attrStatus        = attribute.Key("ratchet.status")
	attrOutcome       = attribute.Key("ratchet.outcome")
)

// telemetry is the engine's OpenTelemetry instrumentation: a Hooks
// implementation for spans, and the counters the engine records itself.
// With the default (global, unconfigured) providers every call is a no-op.
type telemetry struct {
	tracer trace.Tracer

	runsStarted   metric.Int64Counter
	runsFinished  metric.Int64Counter
	phaseDuration metric.Float64Histogram
	recoveries    metric.Int64Counter
	takeovers     metric.Int64Counter
	wakes         metric.Int64Counter
	fencing       metric.Int64Counter
	replays       metric.Int64Counter
	compensations metric.Int64Counter
	reconciles    metric.Int64Counter
	queued        metric.Int64Counter
}

func newTelemetry(tp trace.TracerProvider, mp metric.MeterProvider) (*telemetry, error) {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(instrumentation)
	t := &telemetry{tracer: tp.Tracer(instrumentation)}
	var err error
	counter := func(name, desc string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var c metric.Int64Counter
		c, err = meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{run}"))
		return c
	}
	t.runsStarted = counter("ratchet.runs.started", "Runs created by a start.")
	t.runsFinished = counter("ratchet.runs.finished", "Runs finished, by status.")
	t.recoveries = counter("ratchet.runs.recovered", "Executions that continued a run from its recovery point.")
	t.takeovers = counter("ratchet.lease.takeovers", "Claims of a run whose previous lease had expired or been released.")
	t.wakes = counter("ratchet.runs.woken", "Claims of a parked run whose timer ended or whose signal came, by wait kind.")
	t.fencing = counter("ratchet.lease.fencing_rejections", "Writes refused because another executor holds the run's lease.")
	t.replays = counter("ratchet.runs.replayed", "Starts that found their key taken, by outcome (finished: a stored result replayed).")
	t.compensations = counter("ratchet.compensations", "Compensations begun, and stuck (an undo failed permanently), by outcome.")
	t.queued = counter("ratchet.runs.queued", "Executions that found their run's concurrency key at its limit and queued it for a slot.")
	t.reconciles = counter("ratchet.steps.reconciled", "Steps whose unknown outcome was reconciled (found, not_found) or parked for an operator (parked).")
	if err != nil {
		return nil, err
	}
	t.phaseDuration, err = meter.Float64Histogram("ratchet.phase.duration",
		metric.WithDescription("Time from a phase's start to its commit (or its replay from the journal)."), metric.WithUnit("s"))
	return t, err
}

// Run starts the span of an execution: a child of the caller's span (the
// request, or the River job), linked to the trace of the request that
// created the run when that is another trace.
func (t *telemetry) Run(ctx context.Context, info RunInfo) (context.Context, func(RunEnd)) {
	attrs := []attribute.KeyValue{
		attrRunID.String(info.RunID), attrWorkflow.String(info.Workflow), attrAttempt.Int(info.Attempt),
		attrLeaseToken.Int64(info.LeaseToken), attrRecoveryPoint.String(info.RecoveryPoint), attrResumed.Bool(info.Resumed),
	}
	opts := []trace.SpanStartOption{trace.WithAttributes(attrs...)}
	if origin := spanContextOf(info.Traceparent); origin.IsValid() && origin.TraceID() != trace.SpanContextFromContext(ctx).TraceID() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: origin}))
	}
	if info.Resumed {
		t.recoveries.Add(ctx, 1, metric.WithAttributes(attrWorkflow.String(info.Workflow)))
	}
	ctx, span := t.tracer.Start(ctx, "ratchet.run "+info.Workflow, opts...)
	return ctx, func(end RunEnd) {
		span.SetAttributes(attrStatus.String(string(end.Status)))
		if end.Err != nil {
			span.RecordError(end.Err)
		}
		if end.Err != nil || end.Status == StatusFailed {
			span.SetStatus(codes.Error, errorText(end))
		}
		span.End()
	}
}

func errorText(end RunEnd) string {
	if end.Err != nil {
		return end.Err.Error()
	}
	return "run failed"
}

// Phase starts a phase's span, a child of the run's.
func (t *telemetry) Phase(ctx context.Context, info PhaseInfo) (context.Context, func(error)) {
	attrs := []attribute.KeyValue{
		attrRunID.String(info.RunID), attrWorkflow.String(info.Workflow), attrPhase.String(info.Name),
		attrPhaseKind.String(string(info.Kind)), attrLeaseToken.Int64(info.LeaseToken),
		attrAttempt.Int(info.Attempt), attrReplayed.Bool(info.Replayed),
	}
	if info.ChildKey != "" {
		attrs = append(attrs, attrChildKey.String(info.ChildKey))
	}
	ctx, span := t.tracer.Start(ctx, "ratchet.phase "+info.Name, trace.WithAttributes(attrs...))
	began := time.Now()
	return ctx, func(err error) {
		var parked *parkedError
		switch {
		case errors.As(err, &parked):
			// Not a failure: the run waits, and a later execution's span
			// of the same phase (linked to this trace) ends the wait.
			waitAttrs := []attribute.KeyValue{attribute.String("ratchet.wait.kind", string(parked.wait.Kind))}
			if parked.wait.Until != nil {
				waitAttrs = append(waitAttrs, attribute.String("ratchet.wait.until", parked.wait.Until.UTC().Format(time.RFC3339Nano)))
			}
			span.AddEvent("ratchet.wait", trace.WithAttributes(waitAttrs...))
			err = nil
		case err != nil:
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		default:
			span.SetAttributes(attrRecoveryPoint.String(info.Name))
		}
		span.End()
		t.phaseDuration.Record(ctx, time.Since(began).Seconds(), metric.WithAttributes(
			attrWorkflow.String(info.Workflow), attrPhase.String(info.Name), attrPhaseKind.String(string(info.Kind)),
			attrReplayed.Bool(info.Replayed), attribute.Bool("error", err != nil)))
	}
}

var traceContext = propagation.TraceContext{}

// spanContextOf parses a W3C traceparent.
func spanContextOf(traceparent string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	ctx := traceContext.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
	return trace.SpanContextFromContext(ctx)
}

// traceparentOf formats the span context in ctx as a W3C traceparent, or
// "" when there is none.
func traceparentOf(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)
	return carrier["traceparent"]
}

// hookChain calls the engine's telemetry, then the user's hooks.
type hookChain []Hooks

func (h hookChain) Run(ctx context.Context, info RunInfo) (context.Context, func(RunEnd)) {
	ends := make([]func(RunEnd), len(h))
	for i, hook := range h {
		ctx, ends[i] = hook.Run(ctx, info)
	}
	return ctx, func(end RunEnd) {
		for i := len(ends) - 1; i >= 0; i-- {
			ends[i](end)
		}
	}
}

func (h hookChain) Phase(ctx context.Context, info PhaseInfo) (context.Context, func(error)) {
	ends := make([]func(error), len(h))
	for i, hook := range h {
		ctx, ends[i] = hook.Phase(ctx, info)
	}
	return ctx, func(err error) {
		for i := len(ends) - 1; i >= 0; i-- {
			ends[i](err)
		}
	}
}
