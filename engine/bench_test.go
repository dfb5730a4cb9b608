package engine_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/bench"
	"github.com/ratchet-run/ratchet/internal/testdb"
)

// benchConcurrency is the number of callers driving the database at once.
const benchConcurrency = 16

func benchPool(b *testing.B, tracer pgx.QueryTracer) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.NewURL(b))
	require.NoError(b, err)
	cfg.MaxConns = benchConcurrency
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	return pool
}

// drive calls op from benchConcurrency goroutines until b.N calls are done,
// and reports throughput and latency percentiles. It returns ops/s.
func drive(b *testing.B, op func(ctx context.Context, i int) error) float64 {
	b.Helper()
	b.ResetTimer()
	res, err := bench.Drive(context.Background(), benchConcurrency, b.N, 0, op)
	b.StopTimer()
	require.NoError(b, err)
	b.ReportMetric(res.Rate(), "ops/s")
	b.ReportMetric(float64(res.P50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(res.P99.Microseconds())/1000, "p99-ms")
	return res.Rate()
}

// BenchmarkPhases runs a no-op three-phase workflow; each op is one run.
// The bare sub-benchmark measures, on the same server and concurrency, a
// transaction doing one INSERT and one UPDATE: the physical ceiling of a
// durable phase commit. (`ratchet bench` compares the engine with and
// without a worker in its process.)
//
//	go test -run '^$' -bench Phases -benchtime 5000x ./engine/
func BenchmarkPhases(b *testing.B) {
	b.Run("workflow=noop3", func(b *testing.B) { benchNoop3(b, false) })
	b.Run("workflow=noop3,traced", func(b *testing.B) { benchNoop3(b, true) })
	b.Run("bare=insert+update", benchBare)
}

// benchNoop3 runs the no-op three-phase workflow; traced records every
// span and metric with the SDK (exporting nowhere), against the default
// no-op instrumentation.
func benchNoop3(b *testing.B, traced bool) {
	counter := &bench.Counter{}
	pool := benchPool(b, counter)
	workflows := engine.NewWorkflows()
	noop := func(context.Context, pgx.Tx) (struct{}, error) { return struct{}{}, nil }
	_, err := engine.Register(workflows, "noop3", func(ctx context.Context, _ struct{}) (struct{}, error) {
		for _, name := range []string{"one", "two", "three"} {
			if _, err := engine.Atomic(ctx, name, noop, nil); err != nil {
				return struct{}{}, err
			}
		}
		return struct{}{}, nil
	}, nil)
	require.NoError(b, err)
	cfg := engine.Config{Workflows: workflows}
	if traced {
		cfg.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
		cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	}
	c, err := engine.NewClient(pool, &cfg)
	require.NoError(b, err)

	// Round trips inside phases, counted by hooks on one run by itself.
	probe := &phaseTripCounter{counter: counter}
	probeClient, err := engine.NewClient(pool, &engine.Config{Workflows: workflows, Hooks: probe})
	require.NoError(b, err)
	_, err = probeClient.Start(context.Background(), engine.StartParams{Workflow: "noop3", IdempotencyKey: "probe", Input: []byte(`{}`)})
	require.NoError(b, err)

	before := counter.Read()
	runsPerSec := drive(b, func(ctx context.Context, i int) error {
		res, err := c.Start(ctx, engine.StartParams{Workflow: "noop3", IdempotencyKey: fmt.Sprint("run-", i), Input: []byte(`{}`)})
		if err == nil && res.Run.Status != engine.StatusSucceeded {
			err = fmt.Errorf("run ended %s", res.Run.Status)
		}
		return err
	})
	b.ReportMetric(3*runsPerSec, "phases/s")
	b.ReportMetric(float64(counter.Read().Sub(before).Statements)/float64(b.N), "roundtrips/run")
	b.ReportMetric(float64(counter.Read().Sub(before).Commits)/float64(b.N), "commits/run")
	b.ReportMetric(float64(probe.trips.Load())/3, "roundtrips/phase")
}

// phaseTripCounter counts the statements sent while phases run.
type phaseTripCounter struct {
	counter *bench.Counter
	trips   atomic.Int64
}

func (h *phaseTripCounter) Run(ctx context.Context, _ engine.RunInfo) (context.Context, func(engine.RunEnd)) {
	return ctx, func(engine.RunEnd) {}
}

func (h *phaseTripCounter) Phase(ctx context.Context, _ engine.PhaseInfo) (context.Context, func(error)) {
	before := h.counter.Read().Statements
	return ctx, func(error) { h.trips.Add(h.counter.Read().Statements - before) }
}

// benchBare is the ceiling: a transaction of one INSERT and one UPDATE.
func benchBare(b *testing.B) {
	pool := benchPool(b, nil)
	bare, err := bench.NewBare(context.Background(), pool, benchConcurrency)
	require.NoError(b, err)
	drive(b, bare.Tx(0))
}
