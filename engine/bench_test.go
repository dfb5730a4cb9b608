package engine_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/testdb"
	"github.com/ratchet-run/ratchet/worker"
)

// benchConcurrency is the number of callers driving the database at once.
const benchConcurrency = 16

// statementCounter counts statements sent to the server: each is one round
// trip, since the engine does not pipeline.
type statementCounter struct{ n atomic.Int64 }

func (s *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	s.n.Add(1)
	return ctx
}

func (s *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

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
	latencies := make([]time.Duration, b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	for range benchConcurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				t0 := time.Now()
				if err := op(context.Background(), i); err != nil {
					failed.Store(err)
					return
				}
				latencies[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	slices.Sort(latencies)
	rate := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(rate, "ops/s")
	b.ReportMetric(float64(latencies[b.N/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(latencies[b.N*99/100].Microseconds())/1000, "p99-ms")
	return rate
}

// BenchmarkPhases runs a no-op three-phase workflow; each op is one run.
// The bare sub-benchmark measures, on the same server and concurrency, a
// transaction doing one INSERT and one UPDATE: the physical ceiling of a
// durable phase commit.
//
//	go test -run '^$' -bench Phases -benchtime 5000x ./engine/
func BenchmarkPhases(b *testing.B) {
	b.Run("workflow=noop3", func(b *testing.B) { benchNoop3(b, false, false) })
	b.Run("workflow=noop3,traced", func(b *testing.B) { benchNoop3(b, false, true) })
	b.Run("workflow=noop3,scheduled", func(b *testing.B) { benchNoop3(b, true, false) })
	b.Run("bare=insert+update", benchBare)
}

// benchNoop3 runs the no-op three-phase workflow; scheduled adds what a
// process with a worker pays: the River look inserted with each claim;
// traced records every span and metric with the SDK (exporting nowhere),
// against the default no-op instrumentation.
func benchNoop3(b *testing.B, scheduled, traced bool) {
	counter := &statementCounter{}
	pool := benchPool(b, counter)
	workflows := engine.NewWorkflows()
	noop := func(context.Context, pgx.Tx) (struct{}, error) { return struct{}{}, nil }
	_, err := engine.Register(workflows, "noop3", func(ctx context.Context, _ struct{}) (struct{}, error) {
		for _, name := range []string{"one", "two", "three"} {
			if _, err := engine.Atomic(ctx, name, noop); err != nil {
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
	var c *engine.Client
	if scheduled {
		w, err := worker.New(pool, &worker.Config{InsertOnly: true, Engine: cfg})
		require.NoError(b, err)
		c = w.Engine()
	} else {
		c, err = engine.NewClient(pool, &cfg)
		require.NoError(b, err)
	}

	// Round trips inside phases, counted by hooks on one run by itself.
	probe := &phaseTripCounter{counter: counter}
	probeClient, err := engine.NewClient(pool, &engine.Config{Workflows: workflows, Hooks: probe})
	require.NoError(b, err)
	_, err = probeClient.Start(context.Background(), engine.StartParams{Workflow: "noop3", IdempotencyKey: "probe", Input: []byte(`{}`)})
	require.NoError(b, err)

	counter.n.Store(0)
	runsPerSec := drive(b, func(ctx context.Context, i int) error {
		res, err := c.Start(ctx, engine.StartParams{Workflow: "noop3", IdempotencyKey: fmt.Sprint("run-", i), Input: []byte(`{}`)})
		if err == nil && res.Run.Status != engine.StatusSucceeded {
			err = fmt.Errorf("run ended %s", res.Run.Status)
		}
		return err
	})
	b.ReportMetric(3*runsPerSec, "phases/s")
	b.ReportMetric(float64(counter.n.Load())/float64(b.N), "roundtrips/run")
	b.ReportMetric(float64(probe.trips.Load())/3, "roundtrips/phase")
}

// phaseTripCounter counts the statements sent while phases run.
type phaseTripCounter struct {
	counter *statementCounter
	trips   atomic.Int64
}

func (h *phaseTripCounter) Run(ctx context.Context, _ engine.RunInfo) (context.Context, func(engine.RunEnd)) {
	return ctx, func(engine.RunEnd) {}
}

func (h *phaseTripCounter) Phase(ctx context.Context, _ engine.PhaseInfo) (context.Context, func(error)) {
	before := h.counter.n.Load()
	return ctx, func(error) { h.trips.Add(h.counter.n.Load() - before) }
}

// benchBare is the ceiling: a transaction of one INSERT and one UPDATE.
func benchBare(b *testing.B) {
	pool := benchPool(b, nil)
	_, err := pool.Exec(context.Background(), `
			CREATE TABLE bare_runs (id text PRIMARY KEY, point text NOT NULL);
			CREATE TABLE bare_journal (run_id text NOT NULL, seq int NOT NULL, PRIMARY KEY (run_id, seq))`)
	require.NoError(b, err)
	for i := range benchConcurrency {
		_, err := pool.Exec(context.Background(), `INSERT INTO bare_runs VALUES ($1, 'started')`, fmt.Sprint(i))
		require.NoError(b, err)
	}
	drive(b, func(ctx context.Context, i int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO bare_journal VALUES ($1, $2)`, fmt.Sprint(i%benchConcurrency), i); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE bare_runs SET point = $2 WHERE id = $1`, fmt.Sprint(i%benchConcurrency), fmt.Sprint(i))
			return err
		})
	})
}
