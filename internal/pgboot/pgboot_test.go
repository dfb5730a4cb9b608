package pgboot_test

import (
	"context"
	"fmt"
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
	p, err := pgboot.StartPair(context.Background(), true)
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Stop()) }()
	failsOverWithoutLosingACommit(t, p.URL, p.Fail)
}

// The same under Patroni in synchronous_mode, which promotes the standby
// itself once the killed leader's key expires.
func TestPatroniFailsOverWithoutLosingACommit(t *testing.T) {
	t.Parallel()
	if err := pgboot.PatroniInstalled(); err != nil {
		// Loudly: a skip is otherwise silent without -v.
		fmt.Fprintf(os.Stderr, "SKIPPED %s: %v\n", t.Name(), err)
		t.Skip(err)
	}
	p, err := pgboot.StartPatroni(context.Background(), true)
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Stop()) }()
	failsOverWithoutLosingACommit(t, p.URL, p.Fail)
}

// failsOverWithoutLosingACommit commits a row on url, fails over, and
// requires url to accept writes again and to have the row.
func failsOverWithoutLosingACommit(t *testing.T, url string, fail func(context.Context) error) {
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		require.NoError(t, err)
	}
	exec(`CREATE TABLE t (v text); INSERT INTO t VALUES ('before')`)
	require.NoError(t, fail(ctx))
	exec(`INSERT INTO t VALUES ('after')`)

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var recovering bool
	var got string
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), string_agg(v, ',' ORDER BY v DESC) FROM t`).Scan(&recovering, &got))
	require.False(t, recovering, "the URL reaches the promoted standby")
	require.Equal(t, "before,after", got)
}
