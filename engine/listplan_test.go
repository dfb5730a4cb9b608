package engine_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/bench"
	"github.com/ratchet-run/ratchet/internal/testdb"
	"github.com/ratchet-run/ratchet/migrations"
	"github.com/ratchet-run/ratchet/steps"
)

// seedRuns seeds a history of n runs (bench.SeedHistory says its shape).
func seedRuns(t testing.TB, ctx context.Context, pool *pgxpool.Pool, n int) {
	t.Helper()
	began := time.Now()
	require.NoError(t, bench.SeedHistory(ctx, pool, 1, n, n, func(done int) {
		if n > 250_000 {
			t.Logf("seeded %d of %d runs (%s)", done, n, time.Since(began).Round(time.Second))
		}
	}))
}

// listShapes is every shape of listing: each combination of the filters,
// with a finished and an unfinished status, over the seeded history.
func listShapes(n int) []engine.ListParams {
	var shapes []engine.ListParams
	for mask := range 1 << 5 {
		for _, status := range []engine.Status{"", engine.StatusFailed, engine.StatusWaiting} {
			p := engine.ListParams{Status: status}
			if mask&1 != 0 {
				p.Workflow = "audit"
			}
			if mask&2 != 0 {
				p.IdempotencyKey = bench.HistoryKey("1007")
			}
			if mask&4 != 0 {
				p.ChildKey = "child-key" // replaced by a seeded key
			}
			if mask&8 != 0 {
				p.Blocked = engine.BlockedTimer
			}
			if mask&16 != 0 {
				p.After = fmt.Sprintf("%026d", n/2)
			}
			shapes = append(shapes, p)
		}
	}
	return shapes
}

func nameOf(p engine.ListParams) string {
	var parts []string
	for _, f := range []struct{ name, v string }{{"status", string(p.Status)}, {"workflow", p.Workflow},
		{"key", p.IdempotencyKey}, {"child_key", p.ChildKey}, {"blocked", string(p.Blocked)}, {"after", p.After}} {
		if f.v != "" {
			parts = append(parts, f.name)
			switch f.name {
			case "status":
				parts[len(parts)-1] += "=" + f.v
			case "child_key":
				parts[len(parts)-1] += "=" + f.v[:3]
			}
		}
	}
	if len(parts) == 0 {
		return "all"
	}
	return strings.Join(parts, "+")
}

// maxListPages bounds the pages one page of a listing may read.
const maxListPages = 1000

// planProblems explains the statement for p, with the custom plan and the
// generic one Postgres switches a prepared statement to, and names every
// sequential scan of runs or phases in either.
func planProblems(t *testing.T, ctx context.Context, conn *pgx.Conn, maxPages int, sql string, args ...any) []string {
	t.Helper()
	_, err := conn.Exec(ctx, `DEALLOCATE ALL`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `PREPARE shape AS `+sql)
	require.NoError(t, err)
	literals := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			literals[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		case int:
			literals[i] = strconv.Itoa(v)
		case []byte:
			literals[i] = `'\x` + hex.EncodeToString(v) + `'`
		default:
			t.Fatalf("argument %d of type %T", i, a)
		}
	}
	var problems []string
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		_, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode)
		require.NoError(t, err)
		var plan []struct {
			Plan planNode `json:"Plan"`
		}
		require.NoError(t, conn.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE shape(`+strings.Join(literals, ", ")+`)`).Scan(&plan))
		top := plan[0].Plan
		top.walk(func(n *planNode) {
			if n.NodeType == "Seq Scan" && (n.Relation == "runs" || n.Relation == "phases") {
				problems = append(problems, fmt.Sprintf("%s: a sequential scan of %s", mode, n.Relation))
			}
		})
		// Pages read, rather than time: a plan that walks an index from
		// end to end, filtering, reads thousands.
		if pages := top.SharedHit + top.SharedRead; pages > maxPages {
			problems = append(problems, fmt.Sprintf("%s: %d pages read (at most %d)", mode, pages, maxPages))
		}
		if testing.Verbose() {
			t.Logf("%s: %d pages", mode, top.SharedHit+top.SharedRead)
		}
	}
	return problems
}

type planNode struct {
	NodeType   string     `json:"Node Type"`
	SharedHit  int        `json:"Shared Hit Blocks"`
	SharedRead int        `json:"Shared Read Blocks"`
	Relation   string     `json:"Relation Name"`
	Index      string     `json:"Index Name"`
	Plans      []planNode `json:"Plans"`
}

func (n *planNode) walk(f func(*planNode)) {
	f(n)
	for i := range n.Plans {
		n.Plans[i].walk(f)
	}
}

// expectedList is the listing by its definition: one statement for every
// shape, each filter guarded by "($n = ” OR ...)", as ListRuns once was.
func expectedList(t *testing.T, ctx context.Context, pool *pgxpool.Pool, p engine.ListParams) []string {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT id FROM ratchet.runs r
WHERE tenant = 'default'
	AND ($1 = '' OR workflow = $1)
	AND ($2 = '' OR status = $2)
	AND ($3 = '' OR idempotency_key = $3)
	AND ($4 = '' OR id IN (SELECT run_id FROM ratchet.phases WHERE child_key = $4))
	AND ($5 = '' OR id < $5)
	AND ($6 = '' OR `+engine.BlockedReasonSQL+` = $6)
ORDER BY id DESC LIMIT 50`, p.Workflow, string(p.Status), p.IdempotencyKey, p.ChildKey, p.After, string(p.Blocked))
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return got
}

// TestEveryListShapeReadsAnIndex seeds a history by SQL (RATCHET_LIST_RUNS
// runs, 200,000 by default; 10,000,000 for the figures in
// docs/performance.md) and checks, shape by shape, that neither the
// custom nor the generic plan of the listing's statement scans runs or
// phases sequentially, and that every shape lists what its filters say.
func TestEveryListShapeReadsAnIndex(t *testing.T) {
	t.Parallel()
	n := 200_000
	if v, err := strconv.Atoi(os.Getenv("RATCHET_LIST_RUNS")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	pool := listDatabase(t, ctx, n)
	// Run 1007's receipt step sent a key of format 2, its charge one of
	// format 1: the listing finds the run by either.
	run1007 := fmt.Sprintf("%026d", 1007)
	var keyV1 string
	require.NoError(t, pool.QueryRow(ctx, `SELECT child_key FROM ratchet.phases WHERE run_id = $1 AND seq = 0`, run1007).Scan(&keyV1))
	keyV2, err := steps.ChildKeyV2("default", run1007, "receipt_sent")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE ratchet.phases SET child_key = $2 WHERE run_id = $1 AND seq = 2`, run1007, keyV2)
	require.NoError(t, err)
	// Run 1011 is of format 3: its keys name its request, and its digest
	// finds it.
	run1011 := fmt.Sprintf("%026d", 1011)
	var tenant, idemKey, phaseName string
	require.NoError(t, pool.QueryRow(ctx, `SELECT r.tenant, r.idempotency_key, ph.name FROM ratchet.runs r JOIN ratchet.phases ph ON ph.run_id = r.id
		WHERE r.id = $1 AND ph.seq = 0`, run1011).Scan(&tenant, &idemKey, &phaseName))
	keyV3 := steps.ChildKeyV3(tenant, idemKey, phaseName)
	_, err = pool.Exec(ctx, `WITH r AS (UPDATE ratchet.runs SET key_format = 3 WHERE id = $1)
		UPDATE ratchet.phases SET child_key = $2 WHERE run_id = $1 AND seq = 0`, run1011, keyV3)
	require.NoError(t, err)
	// A live process serves every workflow, so in-flight runs are not
	// "unserved".
	_, err = pool.Exec(ctx, `INSERT INTO ratchet.processes (id, started_at, expires_at, serves) VALUES ('p1', now(), now() + interval '1 hour',
		ARRAY['payment@1', 'refund@1', 'payout@1', 'order@1', 'invoice@1', 'audit@1'])
		ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at`)
	require.NoError(t, err)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	c, err := engine.NewClient(pool, &engine.Config{Workflows: engine.NewWorkflows()})
	require.NoError(t, err)
	// The deploy gate's first page reads the runs in flight, not the
	// history: a page of 2,000 runs, which the seed keeps together.
	t.Run("deploy gate", func(t *testing.T) {
		require.Empty(t, planProblems(t, ctx, conn.Conn(), 2*maxListPages, engine.GateRunsSQL, "", "", 2000))
	})
	var shapes []engine.ListParams
	for _, p := range listShapes(n) {
		if p.ChildKey == "" {
			shapes = append(shapes, p)
			continue
		}
		for _, key := range []string{keyV1, string(keyV2), string(keyV3)} {
			p.ChildKey = key
			shapes = append(shapes, p)
		}
	}
	for _, p := range shapes {
		t.Run(nameOf(p), func(t *testing.T) {
			if p.Blocked == "" || !p.Status.Finished() { // else answered without a statement
				sql, args := engine.ListRunsSQL(p)
				require.Empty(t, planProblems(t, ctx, conn.Conn(), maxListPages, sql, args...))
			}
			got, err := c.ListRuns(ctx, p)
			require.NoError(t, err)
			want := expectedList(t, ctx, pool, p)
			listed := make([]string, len(got))
			for i := range got {
				listed[i] = got[i].ID
			}
			require.Equal(t, want, listed)
		})
	}
}

// listDatabase is a migrated database holding n seeded runs: a test's own,
// or, with RATCHET_LIST_DB set to a connection string, that database,
// seeded on first use and kept, since seeding 10,000,000 runs takes
// minutes.
func listDatabase(t testing.TB, ctx context.Context, n int) *pgxpool.Pool {
	t.Helper()
	url := os.Getenv("RATCHET_LIST_DB")
	if url == "" {
		pool := testdb.New(t, &testdb.Options{MaxConns: 10})
		seedRuns(t, ctx, pool, n)
		return pool
	}
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = migrations.Apply(ctx, pool, nil)
	require.NoError(t, err)
	var have int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs`).Scan(&have))
	switch have {
	case 0:
		seedRuns(t, ctx, pool, n)
	case n:
	default:
		t.Fatalf("%s holds %d runs, not %d: drop it or set RATCHET_LIST_RUNS=%d", url, have, n, have)
	}
	return pool
}

// BenchmarkListShapes reports, for every shape of listing, the median and
// p99 latency of 1,000 calls of ListRuns over the seeded history, one
// after the other on a warmed-up connection, the prepared statement reused
// as a server's connections reuse it (generic plans included).
// Its figures are in docs/performance.md:
//
//	RATCHET_LIST_RUNS=1000000 go test -run '^$' -bench ListShapes -benchtime 1x -timeout 60m ./engine/
//
// With RATCHET_LIST_DB the seeded database is kept for the next run.
func BenchmarkListShapes(b *testing.B) {
	n := 200_000
	if v, err := strconv.Atoi(os.Getenv("RATCHET_LIST_RUNS")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	pool := listDatabase(b, ctx, n)
	var childKey string // of format 1: the lookup that needs an index
	require.NoError(b, pool.QueryRow(ctx, `SELECT child_key FROM ratchet.phases WHERE run_id = $1 AND seq = 0`, fmt.Sprintf("%026d", 1007)).Scan(&childKey))
	c, err := engine.NewClient(pool, &engine.Config{Workflows: engine.NewWorkflows()})
	require.NoError(b, err)
	// Each shape is called warmUp times first, unmeasured: a connection
	// plans its first five executions of a statement afresh (a merged
	// listing takes a few milliseconds to plan) before settling on a plan,
	// which a server's long-lived connections have long done.
	const calls, warmUp = 1000, 10
	var worst []string
	for range b.N {
		for _, p := range listShapes(n) {
			if p.ChildKey != "" {
				p.ChildKey = childKey
			}
			for range warmUp {
				_, err := c.ListRuns(ctx, p)
				require.NoError(b, err)
			}
			took := make([]time.Duration, calls)
			for i := range took {
				began := time.Now()
				_, err := c.ListRuns(ctx, p)
				require.NoError(b, err)
				took[i] = time.Since(began)
			}
			slices.Sort(took)
			p50, p99 := took[calls/2], took[calls*99/100]
			fmt.Printf("%-48s p50 %8s  p99 %8s\n", nameOf(p), p50.Round(time.Microsecond), p99.Round(time.Microsecond))
			worst = append(worst, fmt.Sprintf("%s %s", p99.Round(time.Microsecond), nameOf(p)))
		}
	}
	slices.SortFunc(worst, func(a, b string) int {
		da, _ := time.ParseDuration(strings.Fields(a)[0])
		db, _ := time.ParseDuration(strings.Fields(b)[0])
		return int(db - da)
	})
	fmt.Printf("%d runs; the slowest shapes by p99: %v\n", n, worst[:min(5, len(worst))])
}
