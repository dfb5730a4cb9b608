package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/ratchet-run/ratchet/internal/testdb"
	"github.com/ratchet-run/ratchet/migrations"
	"github.com/ratchet-run/ratchet/steps"
)

// emptyDB returns a pool on a database with nothing applied: the template is
// migrated, so the test drops what it made.
func emptyDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.New(t, &testdb.Options{MaxConns: 8})
	_, err := pool.Exec(context.Background(), "DROP SCHEMA ratchet CASCADE")
	require.NoError(t, err)
	return pool
}

func schemaObjects(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT c.relkind::text || ':' || c.relname FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'ratchet' ORDER BY 1`)
	require.NoError(t, err)
	var names []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		names = append(names, n)
	}
	require.NoError(t, rows.Err())
	return names
}

func TestApplyCreatesSchemaAndReportsCurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyDB(t)

	require.ErrorIs(t, migrations.Check(ctx, pool), migrations.ErrPending)

	res, err := migrations.Apply(ctx, pool, nil)
	require.NoError(t, err)
	all, err := migrations.All()
	require.NoError(t, err)
	require.Len(t, res.Applied, len(all))
	require.NotEmpty(t, res.RiverVersions, "river's tables must be created too")
	require.NoError(t, migrations.Check(ctx, pool))

	objects := schemaObjects(t, pool)
	require.Contains(t, objects, "r:runs")
	require.Contains(t, objects, "r:phases")
	require.Contains(t, objects, "r:river_job")
}

func TestApplyTwiceIsANoOp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyDB(t)

	_, err := migrations.Apply(ctx, pool, nil)
	require.NoError(t, err)
	before := schemaObjects(t, pool)

	res, err := migrations.Apply(ctx, pool, nil)
	require.NoError(t, err)
	require.Empty(t, res.Applied)
	require.Empty(t, res.RiverVersions)
	require.Equal(t, before, schemaObjects(t, pool))
}

func TestApplyConcurrentlyYieldsOneSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyDB(t)

	const callers = 4
	results := make([]*migrations.Result, callers)
	var g errgroup.Group
	for i := range callers {
		g.Go(func() error {
			res, err := migrations.Apply(ctx, pool, nil)
			results[i] = res
			return err
		})
	}
	require.NoError(t, g.Wait())

	all, err := migrations.All()
	require.NoError(t, err)
	applied := 0
	for _, r := range results {
		applied += len(r.Applied)
	}
	require.Equal(t, len(all), applied, "each migration is applied by exactly one caller")
	require.NoError(t, migrations.Check(ctx, pool))

	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM ratchet.schema_migrations").Scan(&n))
	require.Equal(t, len(all), n)
}

// ratchet.request_digest, which the claim of a run of key format 3 stores,
// is steps.RequestDigest, which its child keys carry: otherwise the
// listing would not find a run by its keys.
func TestRequestDigestInSQLIsTheChildKeysDigest(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t, nil)
	for _, v := range [][2]string{{"default", "order-42"}, {"acme", "order-42"}, {"", ""}, {"défaut", "commande-ünïcode-€"},
		{"t", "key with spaces and 'quotes'"}, {"ab", "c"}, {"a", "bc"}} {
		var got []byte
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT ratchet.request_digest($1, $2)`, v[0], v[1]).Scan(&got))
		require.Equal(t, steps.RequestDigest(v[0], v[1]), got, "%q", v)
	}
}

// Contract migrations are the ones whose first line says so; this
// release's is 0014, which drops what 0013 replaced.
func TestContractMigrationsAreMarked(t *testing.T) {
	all, err := migrations.All()
	require.NoError(t, err)
	var contract []string
	for _, m := range all {
		if m.Contract {
			contract = append(contract, m.Name)
		}
	}
	require.Equal(t, []string{"0014_drop_request_key_index.sql"}, contract)
}

// The rules of a run's row that 0019 moved from CHECK constraints to a
// trigger still refuse what they refused, by INSERT and by UPDATE, with
// the error the constraint gave: SQLSTATE 23514 naming it.
func TestRunRulesRefuseWhatTheirConstraintsDid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t, nil)
	// A valid run, leased and unfinished; each case breaks one rule.
	const insert = `INSERT INTO ratchet.runs (id, tenant, idempotency_key, workflow, workflow_version, input,
		fingerprint, status, lease_owner, lease_token, lease_expires_at, attempt)
		VALUES ($1, 't', $1, 'w', 1, '{}', decode(repeat('ab', 32), 'hex'), 'running', 'me', 1, now() + interval '1 minute', 1)`
	for i, tc := range []struct {
		rule     string
		breaking string // an UPDATE of the valid run $1, or an INSERT of a run $1 of its own
	}{
		{"runs_status_check", `UPDATE ratchet.runs SET status = 'sleeping' WHERE id = $1`},
		{"runs_fingerprint_check", `UPDATE ratchet.runs SET fingerprint = '\x00' WHERE id = $1`},
		{"runs_idempotency_key_check", `UPDATE ratchet.runs SET idempotency_key = '' WHERE id = $1`},
		{"runs_idempotency_key_check", `INSERT INTO ratchet.runs (id, tenant, idempotency_key, workflow, workflow_version, input, fingerprint)
			VALUES ($1 || '-long', 't', repeat('k', 256), 'w', 1, '{}', decode(repeat('ab', 32), 'hex'))`},
		{"runs_key_format_check", `UPDATE ratchet.runs SET key_format = 4 WHERE id = $1`},
		{"runs_finished_consistent", `UPDATE ratchet.runs SET status = 'succeeded', lease_expires_at = NULL WHERE id = $1`},
		{"runs_finished_consistent", `UPDATE ratchet.runs SET finished_at = now(), lease_expires_at = NULL WHERE id = $1`},
		{"runs_finished_unleased", `UPDATE ratchet.runs SET status = 'failed', finished_at = now() WHERE id = $1`},
		{"runs_concurrency_declared", `UPDATE ratchet.runs SET concurrency_key = 'refunds/cus_1' WHERE id = $1`},
		{"runs_concurrency_limit_positive", `UPDATE ratchet.runs SET concurrency_key = 'k', concurrency_limit = 0 WHERE id = $1`},
		{"runs_slot_keyed", `UPDATE ratchet.runs SET holds_slot = true WHERE id = $1`},
		{"runs_queue_started_queued", `UPDATE ratchet.runs SET queue_started_at = now() WHERE id = $1`},
		{"runs_waiting_described", `UPDATE ratchet.runs SET status = 'waiting' WHERE id = $1`},
	} {
		requireRefused(t, pool, insert, tc.breaking, tc.rule, fmt.Sprintf("run-%d", i))
	}

	// And what the rules allow still goes: a run finished, unleased, and
	// one keyed and queued holding its slot.
	_, err := pool.Exec(ctx, insert, "run-fine")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE ratchet.runs SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL,
		lease_owner = NULL WHERE id = 'run-fine'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, insert, "run-keyed")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE ratchet.runs SET concurrency_key = 'k', concurrency_limit = 1, holds_slot = true,
		queue = 'gateway', queue_started_at = now() WHERE id = 'run-keyed'`)
	require.NoError(t, err)
}

// The journal's rules, moved to a trigger by 0020, refuse what their
// constraints did, by INSERT and by UPDATE.
func TestPhaseRulesRefuseWhatTheirConstraintsDid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t, nil)
	_, err := pool.Exec(ctx, `INSERT INTO ratchet.runs (id, tenant, idempotency_key, workflow, workflow_version, input, fingerprint)
		VALUES ('run', 't', 'k', 'w', 1, '{}', decode(repeat('ab', 32), 'hex'))`)
	require.NoError(t, err)
	// A valid journal row $1 (its seq and name); each case breaks one rule.
	const insert = `INSERT INTO ratchet.phases (run_id, seq, name, kind, attempts, started_at, finished_at)
		VALUES ('run', $1::integer, 'phase-' || $1::text, 'atomic', 1, now(), now())`
	for i, tc := range []struct {
		rule     string
		breaking string // an UPDATE of the valid row $1, or an INSERT of its own
	}{
		{"phases_kind_check", `UPDATE ratchet.phases SET kind = 'nap' WHERE run_id = 'run' AND seq = $1`},
		{"phases_name_check", `UPDATE ratchet.phases SET name = '' WHERE run_id = 'run' AND seq = $1`},
		{"phases_name_check", `INSERT INTO ratchet.phases (run_id, seq, name, kind, started_at, finished_at)
			VALUES ('run', $1::integer + 1000, repeat('n', 256), 'step', now(), now())`},
		{"phases_seq_check", `UPDATE ratchet.phases SET seq = -1 WHERE run_id = 'run' AND seq = $1`},
		{"phases_attempts_check", `UPDATE ratchet.phases SET attempts = 0 WHERE run_id = 'run' AND seq = $1`},
	} {
		requireRefused(t, pool, insert, tc.breaking, tc.rule, i)
	}
	for i, kind := range []string{"atomic", "step", "sleep", "signal", "compensation", "patch", "start_child", "await_child"} {
		_, err := pool.Exec(ctx, `INSERT INTO ratchet.phases (run_id, seq, name, kind, started_at, finished_at)
			VALUES ('run', $1, $2, $2, now(), now())`, 100+i, kind)
		require.NoError(t, err, kind)
	}
}

// requireRefused inserts a valid row (valid with arg), then runs breaking
// with arg: it must fail as the CHECK constraint rule did.
func requireRefused(t *testing.T, pool *pgxpool.Pool, valid, breaking, rule string, arg any) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, valid, arg)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, breaking, arg)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: %s was accepted (%v)", rule, breaking, err)
	require.Equal(t, "23514", pgErr.Code, "%s: %v", rule, err)
	require.Equal(t, rule, pgErr.ConstraintName, "%s: %v", rule, err)
}

// A schema Apply creates gets the strongest child-key format as the
// database's default; one that existed before 0022 keeps format 1, which
// every earlier release sent.
func TestAFreshSchemaDefaultsToKeyFormat3AndAnExistingOneKeeps1(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewEmpty(t)
	_, err := migrations.Apply(ctx, pool, nil)
	require.NoError(t, err)
	format := func() (f int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT key_format FROM ratchet.settings`).Scan(&f))
		return f
	}
	require.Equal(t, 3, format())

	// The same schema as a release before 0022 left it.
	_, err = pool.Exec(ctx, `DROP TABLE ratchet.settings; DELETE FROM ratchet.schema_migrations WHERE version = 22`)
	require.NoError(t, err)
	res, err := migrations.Apply(ctx, pool, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"0022_key_format_default.sql"}, res.Applied)
	require.Equal(t, 1, format())
}
