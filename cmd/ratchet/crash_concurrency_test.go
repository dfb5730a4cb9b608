package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/testdb"
)

// TestKilledServeHoldingSlotsLeaksNone kills a serve process (API and
// worker) while it executes payments holding their customers' slots, with
// more of each customer's payments queued behind them. The slots it held
// pass on once its leases go stale and its runs are taken over — nothing
// waits for an operator — every payment is charged once, and no customer
// ever had more payments charging, or more slots held, than its limit.
func TestKilledServeHoldingSlotsLeaksNone(t *testing.T) {
	t.Parallel()
	const (
		limit      = 2
		customers  = 3
		perCust    = 6
		staleAfter = 2 * time.Second
	)
	bin := buildCrashBinary(t)
	url := testdb.NewURL(t)

	var victimProc atomic.Pointer[os.Process]
	afterCharge, killed := killNoted(&victimProc)
	gateway := fakes.NewGateway(&fakes.GatewayOpts{
		// Every charge lasts a while, so a customer's payments overlap at
		// the gateway unless the limit keeps them apart.
		Faults: fakes.Faults{Latency: 150 * time.Millisecond},
		// The first charge kills the victim: its other slot holders are
		// mid-charge or between phases, their queues behind them.
		AfterCharge: afterCharge,
	})
	mail := fakes.NewMail(nil)
	gwSrv, mailSrv := httptest.NewServer(gateway), httptest.NewServer(mail)
	defer gwSrv.Close()
	defer mailSrv.Close()
	env := []string{"DATABASE_URL=" + smallPool(url), "RATCHET_GATEWAY_URL=" + gwSrv.URL, "RATCHET_MAIL_URL=" + mailSrv.URL,
		"RATCHET_STALE_AFTER=" + staleAfter.String(), fmt.Sprintf("RATCHET_CUSTOMER_LIMIT=%d", limit)}
	victim := startService(t, bin, env, "serve", "--addr", "127.0.0.1:0")
	survivor := startService(t, bin, env, "serve", "--addr", "127.0.0.1:0")
	victimProc.Store(victim.cmd.Process)
	pool := testdb.Connect(t, url, nil)
	ctx := context.Background()

	// The most slots any key held at once, as the runs table says.
	stopMaxHeld := sampleMax(pool, `SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM ratchet.runs WHERE holds_slot GROUP BY concurrency_key) k`)

	client := &http.Client{Timeout: 30 * time.Second}
	var (
		mu       sync.Mutex
		problems []string
		wg       sync.WaitGroup
	)
	report := func(p string) { mu.Lock(); problems = append(problems, p); mu.Unlock() }
	for c := range customers {
		for i := range perCust {
			key := fmt.Sprintf("slot-%d-%d", c, i)
			body := fmt.Sprintf(`{"amount": %d, "currency": "usd", "customer": "cus_%d", "email": "a@example.com"}`, 100+i, c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r := post(client, runsURL(victim.base, "payment"), key, body); r.err == nil && r.status == http.StatusCreated {
					return
				}
				retryUntil(client, runsURL(survivor.base, "payment"), key, body, func(r postResult) bool { return r.status == http.StatusCreated }, report)
			}()
		}
	}

	var at time.Time
	select {
	case at = <-killed:
	case <-time.After(60 * time.Second):
		t.Fatal("the victim was never killed")
	}
	<-victim.exited
	// The dead process's slots, and the lease token each holder had.
	held := leaseTokens(t, pool, `SELECT id, lease_token FROM ratchet.runs WHERE holds_slot AND lease_owner IS NOT NULL AND finished_at IS NULL`)
	require.NotEmpty(t, held, "the victim died holding slots")

	// Each dead holder is taken over (a new lease token) or finished by
	// the survivor once its lease is stale, and its slot passes on.
	awaitTakenOver(t, pool, held)
	takenOver := time.Since(at)
	// A lease goes stale at most staleAfter after the kill and recovery
	// polls every 500 ms; the bound leaves room for a machine five times
	// slower, far short of a slot left held.
	require.Less(t, takenOver, 5*(staleAfter+500*time.Millisecond), "taken over once stale")

	wg.Wait()
	maxHeld := stopMaxHeld()
	require.Empty(t, problems)

	total := customers * perCust
	var succeeded, holding, queued int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE holds_slot),
		count(*) FILTER (WHERE waiting_for->>'kind' = 'concurrency') FROM ratchet.runs WHERE workflow = 'payment'`).Scan(&succeeded, &holding, &queued))
	require.Equal(t, total, succeeded, "every payment ends succeeded")
	require.Zero(t, holding, "no slot held after the last payment")
	require.Zero(t, queued, "no payment left queued")
	stats := gateway.Stats()
	require.Equal(t, total, stats.Charges, "one charge per payment")
	require.Len(t, stats.ChargesByKey, total)
	for c := range customers {
		require.LessOrEqual(t, stats.MaxInFlightByCustomer[fmt.Sprintf("cus_%d", c)], limit, "cus_%d charging at once", c)
	}
	require.LessOrEqual(t, maxHeld, int64(limit), "slots held by one key at once")
	t.Logf("%d payments over %d customers, limit %d: the victim died holding %d slots, taken over %s after the kill (stale after %s); at most %d slots held per key, %v charging per customer",
		total, customers, limit, len(held), takenOver.Round(time.Millisecond), staleAfter, maxHeld, stats.MaxInFlightByCustomer)
}
