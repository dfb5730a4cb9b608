package engine_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
)

// BenchmarkCheckDeploy times the deploy gate over RATCHET_GATE_RUNS
// (100,000 by default) runs in flight, each waiting for a signal after
// three journaled phases; the runs are seeded by SQL, not executed.
//
//	go test -run '^$' -bench CheckDeploy -benchtime 3x ./engine/
func BenchmarkCheckDeploy(b *testing.B) {
	n := 100_000
	if v, err := strconv.Atoi(os.Getenv("RATCHET_GATE_RUNS")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	pool := benchPool(b, nil)
	seeded := time.Now()
	for _, sql := range []string{`
		INSERT INTO ratchet.runs (id, tenant, idempotency_key, workflow, workflow_version, input, fingerprint,
			status, recovery_point, lease_token, attempt, waiting_for)
		SELECT lpad(i::text, 26, '0'), 'default', 'k' || i, 'bulk', 1, jsonb_build_object('n', i), sha256(i::text::bytea),
			'waiting', 'c', 1, 1, '{"kind": "signal", "phase": "approved", "seq": 3, "signal": "approved"}'
		FROM generate_series(1, $1) i`, `
		INSERT INTO ratchet.phases (run_id, seq, name, kind, output, attempts, started_at, finished_at)
		SELECT lpad(i::text, 26, '0'), p.seq, p.name, 'atomic', to_jsonb(i * 10 + p.seq), 1, now(), now()
		FROM generate_series(1, $1) i, (VALUES (0, 'a'), (1, 'b'), (2, 'c')) p(seq, name)`} {
		_, err := pool.Exec(ctx, sql, n)
		require.NoError(b, err)
	}
	_, err := pool.Exec(ctx, `ANALYZE ratchet.runs, ratchet.phases`)
	require.NoError(b, err)
	b.Logf("seeded %d runs with 3 phases each in %s", n, time.Since(seeded).Round(time.Millisecond))

	type input struct {
		N int `json:"n"`
	}
	workflows := engine.NewWorkflows()
	_, err = engine.Register(workflows, "bulk", func(ctx context.Context, in input) (int, error) {
		sum := 0
		for _, name := range []string{"a", "b", "c"} {
			v, err := engine.Atomic(ctx, name, func(context.Context, pgx.Tx) (int, error) { return 0, nil }, nil)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		_, err := engine.Await[string](ctx, "approved", nil)
		return sum, err
	}, nil)
	require.NoError(b, err)
	c, err := engine.NewClient(pool, &engine.Config{Workflows: workflows})
	require.NoError(b, err)

	b.ResetTimer()
	for range b.N {
		report, err := c.CheckDeploy(ctx, nil)
		require.NoError(b, err)
		require.Equal(b, n, report.Compatible, "%+v", report.Problems)
		b.ReportMetric(float64(report.TookMS), "gate-ms")
		b.ReportMetric(float64(n)/(float64(report.TookMS)/1000), "runs/s")
	}
}
