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
	p := startPatroni(t)
	failsOverWithoutLosingACommit(t, p.URL, p.Fail)
}

// A switchover in synchronous_mode is granted only to the standby Patroni
// has recorded as sync_standby; right after a switchover the old leader
// has just come back as a standby, not yet recorded. Switchover waits for
// Patroni's word instead of being refused (412), both ways, back to back.
func TestPatroniSwitchesOverAndBackWithoutLosingACommit(t *testing.T) {
	t.Parallel()
	p := startPatroni(t)
	failsOverWithoutLosingACommit(t, p.URL, p.Switchover, p.Switchover)
}

func startPatroni(t *testing.T) *pgboot.Patroni {
	t.Helper()
	if err := pgboot.PatroniInstalled(); err != nil {
		// Loudly: a skip is otherwise silent without -v.
		fmt.Fprintf(os.Stderr, "SKIPPED %s: %v\n", t.Name(), err)
		t.Skip(err)
	}
	p, err := pgboot.StartPatroni(context.Background(), true)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Stop()) })
	return p
}

// failsOverWithoutLosingACommit commits a row on url before each failover
// in turn and one after the last, and requires url to accept writes again
// and to have every row.
func failsOverWithoutLosingACommit(t *testing.T, url string, fails ...func(context.Context) error) {
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		require.NoError(t, err)
	}
	exec(`CREATE TABLE t (n int)`)
	want := []int{}
	for i, fail := range fails {
		exec(fmt.Sprintf(`INSERT INTO t VALUES (%d)`, i))
		want = append(want, i)
		require.NoError(t, fail(ctx), "failover %d", i+1)
	}
	exec(fmt.Sprintf(`INSERT INTO t VALUES (%d)`, len(fails)))
	want = append(want, len(fails))

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var recovering bool
	var got []int
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), array_agg(n ORDER BY n) FROM t`).Scan(&recovering, &got))
	require.False(t, recovering, "the URL reaches the promoted standby")
	require.Equal(t, want, got)
}
