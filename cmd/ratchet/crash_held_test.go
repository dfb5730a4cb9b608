package main

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// What the crash tests of limits share: the most of something the runs
// table shows at once while the test runs, and the runs a dead process
// held and their being taken over.

// sampleMax runs query (one integer) every 10 ms until the returned stop
// is called, and stop returns the largest value it read.
func sampleMax(pool *pgxpool.Pool, query string) (stop func() int64) {
	var most atomic.Int64
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			var n int64
			if err := pool.QueryRow(context.Background(), query).Scan(&n); err == nil && n > most.Load() {
				most.Store(n)
			}
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return func() int64 {
		close(done)
		<-stopped
		return most.Load()
	}
}

// leaseTokens reads query's rows (a run's id and lease token): the runs a
// dead process held and the token each had.
func leaseTokens(t *testing.T, pool *pgxpool.Pool, query string) map[string]int64 {
	t.Helper()
	held := map[string]int64{}
	rows, err := pool.Query(context.Background(), query)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var token int64
		require.NoError(t, rows.Scan(&id, &token))
		held[id] = token
	}
	require.NoError(t, rows.Err())
	return held
}

// awaitTakenOver waits until each run of held has a new lease token or is
// finished: taken over once its lease went stale.
func awaitTakenOver(t *testing.T, pool *pgxpool.Pool, held map[string]int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		for id, token := range held {
			var now int64
			var finished bool
			if err := pool.QueryRow(context.Background(), `SELECT lease_token, finished_at IS NOT NULL FROM ratchet.runs WHERE id = $1`, id).Scan(&now, &finished); err != nil || (now == token && !finished) {
				return false
			}
		}
		return true
	}, 60*time.Second, 20*time.Millisecond, "the dead holders are taken over")
}
