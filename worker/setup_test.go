package worker_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/testdb"
)

type testBundle struct {
	url     string
	pool    *pgxpool.Pool
	gateway *fakes.Gateway
	gwURL   string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	url := testdb.NewURL(t)
	pool := testdb.Connect(t, url, &testdb.Options{MaxConns: 12})
	_, err := pool.Exec(context.Background(), `
		CREATE TABLE effects (id bigserial PRIMARY KEY, order_key text NOT NULL, phase text NOT NULL, pid int NOT NULL)`)
	require.NoError(t, err)
	gw := fakes.NewGateway(nil)
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return &testBundle{url: url, pool: pool, gateway: gw, gwURL: srv.URL}
}

// env is what every helper process of the bundle needs.
func (b *testBundle) env(extra ...string) []string {
	return append([]string{"DATABASE_URL=" + b.url, "GATEWAY_URL=" + b.gwURL}, extra...)
}

// runState is what the tests read of a run.
type runState struct {
	ID         string
	Status     string
	FinishedAt *time.Time
}

func (b *testBundle) run(t *testing.T, key string) runState {
	t.Helper()
	var r runState
	err := b.pool.QueryRow(context.Background(),
		`SELECT id, status, finished_at FROM ratchet.runs WHERE tenant = 'default' AND idempotency_key = $1`, key).
		Scan(&r.ID, &r.Status, &r.FinishedAt)
	require.NoError(t, err)
	return r
}

// awaitFinished polls until every key's run has finished and returns when
// each was first seen finished. There is no event to wait on in another
// process; the poll interval bounds the measurement's error.
func (b *testBundle) awaitFinished(t *testing.T, timeout time.Duration, keys ...string) map[string]time.Time {
	t.Helper()
	seen, err := b.pollFinished(timeout, keys...)
	require.NoError(t, err)
	return seen
}

// watchFinished is awaitFinished begun now, on a goroutine of its own, so
// that the test can go on; the returned function waits for its result.
func (b *testBundle) watchFinished(timeout time.Duration, keys ...string) func(t *testing.T) map[string]time.Time {
	type result struct {
		seen map[string]time.Time
		err  error
	}
	done := make(chan result, 1)
	go func() {
		seen, err := b.pollFinished(timeout, keys...)
		done <- result{seen, err}
	}()
	return func(t *testing.T) map[string]time.Time {
		t.Helper()
		r := <-done
		require.NoError(t, r.err)
		return r.seen
	}
}

// pollFinished is awaitFinished for any goroutine.
func (b *testBundle) pollFinished(timeout time.Duration, keys ...string) (map[string]time.Time, error) {
	seen := map[string]time.Time{}
	deadline := time.Now().Add(timeout)
	for len(seen) < len(keys) {
		if time.Now().After(deadline) {
			var missing []string
			for _, k := range keys {
				if _, ok := seen[k]; !ok {
					missing = append(missing, k)
				}
			}
			return seen, fmt.Errorf("%d runs not finished after %s, e.g. %v", len(missing), timeout, missing[:min(len(missing), 5)])
		}
		rows, err := b.pool.Query(context.Background(),
			`SELECT idempotency_key FROM ratchet.runs WHERE finished_at IS NOT NULL AND idempotency_key = ANY($1)`, keys)
		if err != nil {
			return seen, err
		}
		done, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return seen, err
		}
		now := time.Now()
		for _, k := range done {
			if _, ok := seen[k]; !ok {
				seen[k] = now
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return seen, nil
}

// effects counts, per order key and phase, the committed side effects.
func (b *testBundle) effects(t *testing.T) map[[2]string]int {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT order_key, phase, count(*) FROM effects GROUP BY 1, 2`)
	require.NoError(t, err)
	out := map[[2]string]int{}
	for rows.Next() {
		var k, p string
		var n int
		require.NoError(t, rows.Scan(&k, &p, &n))
		out[[2]string{k, p}] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// requireExactlyOnce checks that each key's run succeeded with each atomic
// phase's effect committed once and one charge under its child key.
func (b *testBundle) requireExactlyOnce(t *testing.T, keys ...string) {
	t.Helper()
	effects := b.effects(t)
	stats := b.gateway.Stats()
	// A client of no workflow, to read the runs with.
	reader, err := engine.NewClient(b.pool, &engine.Config{Workflows: engine.NewWorkflows()})
	require.NoError(t, err)
	for _, key := range keys {
		r := b.run(t, key)
		require.Equal(t, "succeeded", r.Status, "run %s", key)
		require.Equal(t, 1, effects[[2]string{key, "reserved"}], "reserved effects of %s", key)
		require.Equal(t, 1, effects[[2]string{key, "posted"}], "posted effects of %s", key)
		run, err := reader.GetRun(context.Background(), r.ID)
		require.NoError(t, err)
		child := enginetest.ChildKey(t, run, "charged")
		require.Equal(t, 1, stats.ChargesByKey[child], "charges of %s", key)
	}
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}
