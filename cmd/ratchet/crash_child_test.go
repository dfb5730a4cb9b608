package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/testdb"
)

// TestKilledProcessesStartNoChildTwice kills serve processes (API and
// worker, as deployed) running orders that fan out to a shipment per
// parcel: one right after an order started its second shipment, one as a
// shipment begins booking while its order waits for it. Every order ends
// succeeded with one shipment run per parcel and one booking per parcel,
// its clients retrying against a second process.
func TestKilledProcessesStartNoChildTwice(t *testing.T) {
	t.Parallel()
	bin := buildCrashBinary(t)
	url := testdb.NewURL(t)
	gwSrv, mailSrv := httptest.NewServer(fakes.NewGateway(nil)), httptest.NewServer(fakes.NewMail(nil))
	defer gwSrv.Close()
	defer mailSrv.Close()
	env := []string{"DATABASE_URL=" + smallPool(url), "RATCHET_GATEWAY_URL=" + gwSrv.URL, "RATCHET_MAIL_URL=" + mailSrv.URL, "RATCHET_STALE_AFTER=2s"}
	survivor := startService(t, bin, env, "serve", "--addr", "127.0.0.1:0")
	client := &http.Client{Timeout: 30 * time.Second}
	const perPoint = 3
	var (
		mu       sync.Mutex
		problems []string
		orderIDs []string
	)
	for _, point := range []string{"end:ship-p2", "start:booked"} {
		victim := startService(t, bin, append(env, "RATCHET_CRASH_AT="+point), "serve", "--addr", "127.0.0.1:0")
		var wg sync.WaitGroup
		for i := range perPoint {
			id := fmt.Sprintf("%s-%d", strings.NewReplacer(":", "-").Replace(point), i)
			orderIDs = append(orderIDs, id)
			body := fmt.Sprintf(`{"id": %q, "parcels": ["p1", "p2", "p3", "p4"]}`, id)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r := post(client, runsURL(victim.base, "order"), id, body); r.err == nil && r.status == http.StatusCreated {
					return
				}
				retryUntil(client, runsURL(survivor.base, "order"), id, body, func(r postResult) bool { return r.status == http.StatusCreated }, func(problem string) {
					mu.Lock()
					problems = append(problems, problem)
					mu.Unlock()
				})
			}()
		}
		wg.Wait()
		select {
		case <-victim.exited:
			ws := victim.cmd.ProcessState.Sys().(syscall.WaitStatus)
			require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "%s: the victim died of SIGKILL, not %v", point, victim.cmd.ProcessState)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the victim was never killed", point)
		}
	}
	require.Empty(t, problems)

	pool := testdb.Connect(t, url, nil)
	ctx := context.Background()
	for _, id := range orderIDs {
		var status string
		var children, childrenSucceeded int
		require.NoError(t, pool.QueryRow(ctx, `SELECT r.status,
				(SELECT count(*) FROM ratchet.runs c WHERE c.parent_run_id = r.id),
				(SELECT count(*) FROM ratchet.runs c WHERE c.parent_run_id = r.id AND c.status = 'succeeded')
			FROM ratchet.runs r WHERE r.workflow = 'order' AND r.idempotency_key = $1`, id).Scan(&status, &children, &childrenSucceeded))
		require.Equal(t, "succeeded", status, id)
		require.Equal(t, 4, children, "%s: one shipment per parcel", id)
		require.Equal(t, 4, childrenSucceeded, id)
		var bookings, parcels int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT parcel) FROM orders.bookings WHERE order_id = $1`, id).Scan(&bookings, &parcels))
		require.Equal(t, 4, parcels, id)
		require.Equal(t, 4, bookings, "%s: each parcel booked once", id)
	}
	t.Logf("%d orders of 4 parcels over 2 crash points: every order succeeded with 4 shipments and 4 bookings", len(orderIDs))
}
