package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/testdb"
)

// TestKilledServeHoldingQueueRoomLeaksNone kills a serve process (API and
// worker) while payments it started from the gateway queue are charging,
// with the rest of a batch waiting in the queue behind them. The room its
// runs held passes on once their leases go stale and another process
// takes them over; the batch finishes, each payment charged once, and
// neither the queue's concurrency nor its rate limit was ever exceeded —
// as the gateway saw it and as the runs table says.
func TestKilledServeHoldingQueueRoomLeaksNone(t *testing.T) {
	t.Parallel()
	const (
		concurrency = 2
		rate        = 5 // starts a second
		batch       = 12
		staleAfter  = 2 * time.Second
	)
	bin := buildCrashBinary(t)
	url := testdb.NewURL(t)

	var victimProc atomic.Pointer[os.Process]
	afterCharge, killed := killNoted(&victimProc)
	gateway := fakes.NewGateway(&fakes.GatewayOpts{
		// Charges last long enough that the queue's concurrency, not its
		// rate, is what keeps them apart.
		Faults:      fakes.Faults{Latency: 600 * time.Millisecond},
		AfterCharge: afterCharge,
	})
	mail := fakes.NewMail(nil)
	gwSrv, mailSrv := httptest.NewServer(gateway), httptest.NewServer(mail)
	defer gwSrv.Close()
	defer mailSrv.Close()
	env := []string{"DATABASE_URL=" + smallPool(url), "RATCHET_GATEWAY_URL=" + gwSrv.URL, "RATCHET_MAIL_URL=" + mailSrv.URL,
		"RATCHET_STALE_AFTER=" + staleAfter.String(), "RATCHET_CUSTOMER_LIMIT=100",
		fmt.Sprintf("RATCHET_GATEWAY_CONCURRENCY=%d", concurrency), fmt.Sprintf("RATCHET_GATEWAY_RATE=%d", rate)}
	// The victim runs alone until it dies, so the room the queue has is
	// all its own when it is killed.
	victim := startService(t, bin, env, "serve", "--addr", "127.0.0.1:0")
	victimProc.Store(victim.cmd.Process)
	pool := testdb.Connect(t, url, nil)
	ctx := context.Background()

	// The most of the queue's runs executing at once, as the runs table
	// says, sampled until the batch is done.
	stopMaxExecuting := sampleMax(pool, `SELECT count(*) FROM ratchet.runs WHERE queue = 'gateway' AND queue_started_at IS NOT NULL AND finished_at IS NULL`)

	client := &http.Client{Timeout: 30 * time.Second}
	queued := http.Header{"Ratchet-Queue": {"gateway"}}
	// One customer: the gateway's in-flight count for it is the batch's.
	body := func(i int) string {
		return fmt.Sprintf(`{"amount": %d, "currency": "usd", "customer": "cus_batch", "email": "a@example.com"}`, 100+i)
	}
	var unsent []int
	for i := range batch {
		r := postWith(client, runsURL(victim.base, "payment"), fmt.Sprintf("batch-%d", i), body(i), queued)
		if r.err != nil {
			unsent = append(unsent, i) // the victim died first: sent again below
			continue
		}
		// A queued run executes nothing inline: it is created and answered.
		require.Equal(t, http.StatusAccepted, r.status, "batch-%d", i)
	}

	var at time.Time
	select {
	case at = <-killed:
	case <-time.After(60 * time.Second):
		t.Fatal("the victim was never killed")
	}
	<-victim.exited
	// The queue's room the dead process held: its runs started from the
	// queue and unfinished, with the lease token each had.
	held := leaseTokens(t, pool, `SELECT id, lease_token FROM ratchet.runs
		WHERE queue = 'gateway' AND queue_started_at IS NOT NULL AND finished_at IS NULL AND lease_owner IS NOT NULL`)
	require.NotEmpty(t, held, "the victim died holding queue room")
	var waiting int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs WHERE waiting_for->>'kind' = 'queue'`).Scan(&waiting))
	require.Positive(t, waiting, "runs wait in the queue behind the dead holders")

	survivor := startService(t, bin, env, "serve", "--addr", "127.0.0.1:0")
	for _, i := range unsent {
		r := postWith(client, runsURL(survivor.base, "payment"), fmt.Sprintf("batch-%d", i), body(i), queued)
		require.NoError(t, r.err)
		require.Equal(t, http.StatusAccepted, r.status, "batch-%d", i)
	}
	awaitTakenOver(t, pool, held)
	takenOver := time.Since(at)
	// Stale at most staleAfter after the kill, found at the next 500 ms
	// poll, plus the survivor's start; the bound leaves room for a machine
	// five times slower, far short of room left held.
	require.Less(t, takenOver, 5*(staleAfter+500*time.Millisecond)+10*time.Second, "taken over once stale")

	require.Eventually(t, func() bool {
		var unfinished int
		return pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs WHERE workflow = 'payment' AND finished_at IS NULL`).Scan(&unfinished) == nil && unfinished == 0
	}, 120*time.Second, 50*time.Millisecond, "the batch finishes")
	maxExecuting := stopMaxExecuting()

	var succeeded, everStarted int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'succeeded'), count(queue_started_at)
		FROM ratchet.runs WHERE workflow = 'payment'`).Scan(&succeeded, &everStarted))
	require.Equal(t, batch, succeeded, "every payment ends succeeded")
	require.Equal(t, batch, everStarted, "every payment left the queue")
	// The most starts in any window of a second: each start opens one.
	var maxStarts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(n) FROM (
		SELECT (SELECT count(*) FROM ratchet.runs o WHERE o.queue = 'gateway'
			AND o.queue_started_at >= r.queue_started_at AND o.queue_started_at < r.queue_started_at + interval '1 second') AS n
		FROM ratchet.runs r WHERE r.queue = 'gateway') w`).Scan(&maxStarts))
	require.LessOrEqual(t, maxStarts, rate, "starts in any second")
	stats := gateway.Stats()
	require.Equal(t, batch, stats.Charges, "one charge per payment")
	require.Len(t, stats.ChargesByKey, batch)
	require.LessOrEqual(t, stats.MaxInFlightByCustomer["cus_batch"], concurrency, "charging at once")
	require.LessOrEqual(t, maxExecuting, int64(concurrency), "queue runs executing at once")
	t.Logf("%d queued payments, concurrency %d, %d a second: the victim died holding %d of the room, taken over %s after the kill (stale after %s); at most %d executing, %d charging, %d starts in a second",
		batch, concurrency, rate, len(held), takenOver.Round(time.Millisecond), staleAfter, maxExecuting, stats.MaxInFlightByCustomer["cus_batch"], maxStarts)
}
