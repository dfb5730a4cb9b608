package pgboot_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/internal/pgboot"
)

func TestStartsAThrowawayClusterAndDeletesIt(t *testing.T) {
	t.Parallel()
	if _, err := pgboot.FindBin(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	c, err := pgboot.Start(ctx)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, c.URL)
	require.NoError(t, err)
	var one int
	require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.NoError(t, conn.Close(ctx))

	require.NoError(t, c.Stop())
	_, err = pgx.Connect(ctx, c.URL)
	require.Error(t, err, "the server is stopped")
	_, err = os.Stat(c.Dir)
	require.True(t, os.IsNotExist(err), "the cluster's directory is deleted")
}

// A synchronous pair: what the primary committed is on the standby when
// it is promoted, and the pair's URL then reaches the standby for writes.
func TestSynchronousPairFailsOverWithoutLosingACommit(t *testing.T) {
	t.Parallel()
	if _, err := pgboot.FindBin(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	p, err := pgboot.StartPair(ctx, true)
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Stop()) }()
	exec := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, p.URL)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		require.NoError(t, err)
	}
	exec(`CREATE TABLE t (v text); INSERT INTO t VALUES ('before')`)
	require.NoError(t, p.Fail(ctx))
	exec(`INSERT INTO t VALUES ('after')`)

	conn, err := pgx.Connect(ctx, p.Standby.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var got string
	require.NoError(t, conn.QueryRow(ctx, `SELECT string_agg(v, ',' ORDER BY v DESC) FROM t`).Scan(&got))
	require.Equal(t, "before,after", got)
}
