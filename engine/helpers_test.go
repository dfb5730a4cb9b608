package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/testdb"
)

// testBundle is what setup gives a test: a migrated database of its own and
// a table of counters that workflows bump as their observable side effect.
type testBundle struct {
	pool *pgxpool.Pool
	url  string // for processes of the test's own
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	url := testdb.NewURL(t)
	pool := testdb.Connect(t, url, &testdb.Options{MaxConns: 24})
	_, err := pool.Exec(context.Background(), `CREATE TABLE counters (name text PRIMARY KEY, n integer NOT NULL)`)
	require.NoError(t, err)
	return &testBundle{pool: pool, url: url}
}

// client returns a client over the bundle's database with its own registry,
// as a separate process would have. cfg may be nil.
func (b *testBundle) client(t *testing.T, workflows *engine.Workflows, cfg *engine.Config) *engine.Client {
	t.Helper()
	if cfg == nil {
		cfg = &engine.Config{}
	}
	cfg.Workflows = workflows
	c, err := engine.NewClient(b.pool, cfg)
	require.NoError(t, err)
	return c
}

// bump increments counter name inside tx: the side effect of a phase.
func bump(ctx context.Context, tx pgx.Tx, name string) (int, error) {
	var n int
	err := tx.QueryRow(ctx, `
		INSERT INTO counters (name, n) VALUES ($1, 1)
		ON CONFLICT (name) DO UPDATE SET n = counters.n + 1
		RETURNING n`, name).Scan(&n)
	return n, err
}

func (b *testBundle) counter(t *testing.T, name string) int {
	t.Helper()
	var n int
	err := b.pool.QueryRow(context.Background(), `SELECT coalesce((SELECT n FROM counters WHERE name = $1), 0)`, name).Scan(&n)
	require.NoError(t, err)
	return n
}

func (b *testBundle) countRows(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{"ratchet", table}.Sanitize()).Scan(&n))
	return n
}

// expireLease makes a run's lease expire now, standing in for an executor
// paused (or dead) for longer than stale_after.
func (b *testBundle) expireLease(t *testing.T, runID string) {
	t.Helper()
	tag, err := b.pool.Exec(context.Background(),
		`UPDATE ratchet.runs SET lease_expires_at = now() - interval '1 millisecond' WHERE id = $1 AND lease_expires_at IS NOT NULL`, runID)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "run %s has no lease to expire", runID)
}

// runIDForKey returns the id of the run holding key in the default tenant.
func (b *testBundle) runIDForKey(t *testing.T, key string) string {
	t.Helper()
	var id string
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT id FROM ratchet.runs WHERE tenant = 'default' AND idempotency_key = $1`, key).Scan(&id))
	return id
}

// receive waits for a value on ch, failing the test after a generous bound
// so that a broken engine fails instead of hanging.
func receive[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatal("timed out waiting for the workflow")
		panic("unreachable")
	}
}

// constantRetry retries a run after d every time (at once for 0), for ever.
func constantRetry(d time.Duration) engine.RetryPolicy {
	d = max(d, time.Nanosecond)
	return engine.RetryPolicy{InitialInterval: d, MaxInterval: d, Multiplier: 1, Jitter: -1}
}

// childKey is the key the run's phase sends downstream, in the run's
// format.
func childKey(t *testing.T, run *engine.Run, phase string) string {
	t.Helper()
	key, err := run.ChildKey(phase)
	require.NoError(t, err)
	return string(key)
}

// childKeyOf is childKey for the run with id runID.
func childKeyOf(t *testing.T, c *engine.Client, runID, phase string) string {
	t.Helper()
	run, err := c.GetRun(context.Background(), runID)
	require.NoError(t, err)
	return childKey(t, run, phase)
}
