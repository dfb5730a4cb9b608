package bench_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/internal/bench"
	"github.com/ratchet-run/ratchet/internal/testdb"
)

// A bulk seed drops the indexes and key constraints of runs and phases and
// builds them again: afterwards they are exactly as the migrations made
// them, and the rows are all there.
func TestBulkSeedRebuildsIndexesAndConstraintsAsTheyWere(t *testing.T) {
	defer bench.SetBulkSeed(1000)()
	ctx := context.Background()
	pool := testdb.New(t, nil)
	definitions := func() []string {
		rows, err := pool.Query(ctx, `
			SELECT indexdef FROM pg_indexes WHERE schemaname = 'ratchet' AND tablename IN ('runs', 'phases', 'signals')
			UNION ALL
			SELECT conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint WHERE connamespace = 'ratchet'::regnamespace
			ORDER BY 1`)
		require.NoError(t, err)
		var out []string
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s))
			out = append(out, s)
		}
		require.NoError(t, rows.Err())
		return out
	}
	before := definitions()
	require.NoError(t, bench.SeedHistory(ctx, pool, 1, 3000, 3000, nil))
	require.Equal(t, before, definitions())
	var runs, phases int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ratchet.runs), (SELECT count(*) FROM ratchet.phases)`).Scan(&runs, &phases))
	require.Equal(t, [2]int{3000, 9000}, [2]int{runs, phases})
}
