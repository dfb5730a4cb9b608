package migrations_test

import (
	"context"
	"testing"

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
