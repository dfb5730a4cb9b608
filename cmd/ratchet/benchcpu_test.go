package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/internal/testdb"
)

// The sampler counts the CPU of its own database's backends, one that
// starts during the measurement whole, and none of another database's
// busy backend; without the server's processes to read it attributes
// nothing rather than a figure.
func TestBackendSamplerCountsOnlyItsDatabasesBackends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ours := testdb.Connect(t, testdb.NewURL(t), nil)
	theirs := testdb.Connect(t, testdb.NewURL(t), nil)
	// Busy backends, each held open, and their pids.
	busy := func(url string) (pid int) {
		t.Helper()
		conn := testdb.Connect(t, url, nil)
		c, err := conn.Acquire(ctx)
		require.NoError(t, err)
		t.Cleanup(c.Release)
		require.NoError(t, c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
		var n int64
		// Some CPU time: ticks are a hundredth of a second.
		require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM generate_series(1, 3000000)`).Scan(&n))
		return pid
	}

	var since time.Time
	require.NoError(t, ours.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&since))
	s := newBackendSampler(isLocal(ours.Config().ConnConfig.Host), since)
	s.sample(ctx, ours)
	ourPid := busy(ours.Config().ConnString())
	theirPid := busy(theirs.Config().ConnString())
	s.sample(ctx, ours)

	_, local := postgresTicks(ourPid)
	require.True(t, local, "the tests' Postgres runs on this host")
	ticks, ok := s.ticks()
	require.True(t, ok)
	require.Positive(t, ticks, "a backend that started in the measurement counts whole")
	var pids []int
	for id, b := range s.backends {
		require.GreaterOrEqual(t, b.last, b.first)
		pids = append(pids, id.pid)
	}
	require.Contains(t, pids, ourPid)
	require.NotContains(t, pids, theirPid, "another database's backend is not the benchmark's")
	require.GreaterOrEqual(t, s.most, 2, "the pool's connection and the busy one")

	remote := newBackendSampler(false, since)
	remote.sample(ctx, ours)
	_, ok = remote.ticks()
	require.False(t, ok, "a server on another host is not attributed")
	require.GreaterOrEqual(t, remote.most, 2, "its connections are still counted")
}
