package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/testdb"
)

// TestKilledProcessesStartEachScheduleTickOnce ticks a schedule of one
// payment a second on two serve processes (API and worker, as deployed)
// while they are killed with SIGKILL, one and then both at once, and
// started again. With catch-up all, every tick from the first to the last
// started exactly one run — none twice, none skipped, the ticks missed
// while both were down included — and each payment was charged once.
func TestKilledProcessesStartEachScheduleTickOnce(t *testing.T) {
	t.Parallel()
	bin := buildCrashBinary(t)
	url := testdb.NewURL(t)
	gateway, mail := fakes.NewGateway(nil), fakes.NewMail(nil)
	gwSrv, mailSrv := httptest.NewServer(gateway), httptest.NewServer(mail)
	defer gwSrv.Close()
	defer mailSrv.Close()
	env := []string{"DATABASE_URL=" + smallPool(url), "RATCHET_GATEWAY_URL=" + gwSrv.URL, "RATCHET_MAIL_URL=" + mailSrv.URL, "RATCHET_STALE_AFTER=2s"}
	serve := func() *service { return startService(t, bin, env, "serve", "--addr", "127.0.0.1:0") }
	sigkill := func(s *service) {
		t.Helper()
		require.NoError(t, s.cmd.Process.Kill())
		<-s.exited
	}
	client := &http.Client{Timeout: 30 * time.Second}
	call := func(s *service, method, path, body string) int {
		t.Helper()
		req, err := http.NewRequest(method, s.base+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}

	procs := []*service{serve(), serve()}
	require.Equal(t, http.StatusOK, call(procs[0], http.MethodPut, "/v1/schedules/charge-every-second",
		`{"every": 1, "workflow": "payment", "catch_up": "all", "overlap": "allow",
		  "input": {"amount": 100, "currency": "usd", "customer": "cus_sub", "email": "a@example.com"}}`))
	pool := testdb.Connect(t, url, nil)
	ctx := context.Background()
	ticked := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs WHERE idempotency_key LIKE 'schedule/charge-every-second/%'`).Scan(&n))
		return n
	}
	// Wait for ticks between kills: the processes are ticking, not just
	// starting.
	ticksPast := func(n int) {
		t.Helper()
		want := ticked() + n
		require.Eventually(t, func() bool { return ticked() >= want }, 60*time.Second, 20*time.Millisecond, "%d more ticks", n)
	}
	ticksPast(2)
	for round := range 4 { // one at a time
		i := round % 2
		sigkill(procs[i])
		ticksPast(1) // the other ticks on
		procs[i] = serve()
	}
	sigkill(procs[0]) // then both: ticks are missed
	sigkill(procs[1])
	missed := ticked()
	require.Eventually(t, func() bool {
		var behind bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT now() - next_tick_at > interval '3 seconds' FROM ratchet.schedules WHERE name = 'charge-every-second'`).Scan(&behind))
		return behind
	}, 60*time.Second, 50*time.Millisecond, "three ticks missed while both are down")
	require.Equal(t, missed, ticked(), "nothing ticked while both were down")
	procs[0], procs[1] = serve(), serve()
	ticksPast(5) // the missed ticks, caught up, and more
	require.Equal(t, http.StatusOK, call(procs[1], http.MethodPost, "/v1/schedules/charge-every-second/pause", ""))

	var keys []string
	require.Eventually(t, func() bool {
		rows, err := pool.Query(ctx, `SELECT idempotency_key, status FROM ratchet.runs WHERE idempotency_key LIKE 'schedule/charge-every-second/%'`)
		require.NoError(t, err)
		keys = keys[:0]
		done := true
		for rows.Next() {
			var k, status string
			require.NoError(t, rows.Scan(&k, &status))
			keys = append(keys, k)
			done = done && status == "succeeded"
		}
		require.NoError(t, rows.Err())
		return done
	}, 90*time.Second, 50*time.Millisecond, "every tick's payment succeeds")
	sort.Strings(keys)
	ticks := make([]time.Time, len(keys))
	for i, k := range keys {
		tick, err := time.Parse(time.RFC3339, strings.TrimPrefix(k, "schedule/charge-every-second/"))
		require.NoError(t, err, k)
		ticks[i] = tick
		if i > 0 {
			require.Equal(t, time.Second, tick.Sub(ticks[i-1]), "tick after %s: none skipped, none twice", ticks[i-1].Format(time.TimeOnly))
		}
	}
	stats := gateway.Stats()
	require.Equal(t, len(keys), stats.Charges, "one charge per tick")
	for key, n := range stats.ChargesByKey {
		require.Equal(t, 1, n, key)
	}
	t.Logf("%d ticks from %s to %s over four single kills and one outage of both (%d ticks after it, the missed ones among them), %d charges",
		len(ticks), ticks[0].Format(time.TimeOnly), ticks[len(ticks)-1].Format(time.TimeOnly), ticked()-missed, stats.Charges)
}
