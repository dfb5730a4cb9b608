package refunds_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/examples/refunds"
	"github.com/ratchet-run/ratchet/steps"
	"github.com/ratchet-run/ratchet/worker"
)

// gateway is a refund endpoint that remembers idempotency keys, as a real
// gateway does: the same key is the same refund.
type gateway struct {
	mu      sync.Mutex
	calls   map[string]int    // by Idempotency-Key
	refunds map[string]string // key → refund id
	failing int               // answer 503 to this many more calls
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	key := r.Header.Get("Idempotency-Key")
	g.calls[key]++
	if g.failing > 0 {
		g.failing--
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	id, ok := g.refunds[key]
	if !ok {
		id = fmt.Sprintf("re_%d", len(g.refunds)+1)
		g.refunds[key] = id
	}
	json.NewEncoder(w).Encode(map[string]string{"id": id}) //nolint:errcheck // test server
}

func (g *gateway) stats() (calls map[string]int, refunds int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	calls = make(map[string]int, len(g.calls))
	for k, n := range g.calls {
		calls[k] = n
	}
	return calls, len(g.refunds)
}

type bundle struct {
	db      *enginetest.Database
	gateway *gateway
	notices chan string // Idempotency-Key of each notice received
	refunds *refunds.Refunds
	flows   *engine.Workflows
	refund  *engine.Workflow[refunds.Input, refunds.Output]
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{
		db:      enginetest.New(t, nil),
		gateway: &gateway{calls: map[string]int{}, refunds: map[string]string{}},
		notices: make(chan string, 10),
	}
	gw := httptest.NewServer(b.gateway)
	t.Cleanup(gw.Close)
	notify := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.notices <- r.Header.Get("Idempotency-Key")
	}))
	t.Cleanup(notify.Close)

	ctx := context.Background()
	require.NoError(t, refunds.Setup(ctx, b.db.Pool))
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO refunds.payments (id, charge_id, customer, currency, amount) VALUES ('pay_1', 'ch_1', 'cus_1', 'eur', 5000)`)
	require.NoError(t, err)

	b.refunds, err = refunds.New(refunds.Config{GatewayURL: gw.URL, NotifyURL: notify.URL})
	require.NoError(t, err)
	b.flows = engine.NewWorkflows()
	b.refund, err = b.refunds.Register(b.flows)
	require.NoError(t, err)
	return b
}

// client is an engine client as one process would have it.
func (b *bundle) client(t *testing.T) *engine.Client {
	t.Helper()
	c, err := engine.NewClient(b.db.Pool, &engine.Config{Workflows: b.flows, StepPolicy: steps.Policy{InitialInterval: time.Millisecond}})
	require.NoError(t, err)
	t.Cleanup(func() { c.Shutdown(context.Background()) }) //nolint:errcheck // nothing left running
	return c
}

// deliverNotices starts a worker that works the outbox's notices.
func (b *bundle) deliverNotices(t *testing.T) {
	t.Helper()
	workers := river.NewWorkers()
	require.NoError(t, b.refunds.AddWorkers(workers))
	w, err := worker.New(b.db.Pool, &worker.Config{
		Engine:  engine.Config{Workflows: b.flows},
		Workers: workers, Queues: map[string]river.QueueConfig{refunds.QueueNotices: {MaxWorkers: 1}},
		FetchPollInterval: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
}

func (b *bundle) count(t *testing.T, query string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), query).Scan(&n))
	return n
}

// requireRecordedOnce checks the refund's effects: one refund downstream,
// sent with the run's child key; one reversal summing to zero; the
// payment's refunded total; one notice staged.
func (b *bundle) requireRecordedOnce(t *testing.T, run *engine.Run, amount int64) {
	t.Helper()
	calls, made := b.gateway.stats()
	require.Equal(t, 1, made, "one refund at the gateway")
	key := enginetest.ChildKey(t, run, "refund_created")
	require.Contains(t, calls, key, "sent with the step's child key")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM refunds.ledger_entries`))
	require.Equal(t, 0, b.count(t, `SELECT coalesce(sum(amount), 0) FROM refunds.ledger_entries`), "the reversal balances")
	require.Equal(t, int(amount), b.count(t, `SELECT refunded FROM refunds.payments WHERE id = 'pay_1'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ratchet.river_job WHERE kind = 'refunds.notice'`), "one notice staged")
}

func TestRefundReversesTheLedgerAndNotifiesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.deliverNotices(t)
	b.gateway.failing = 2 // the step retries, with the same key
	c := b.client(t)

	res, err := b.refund.Start(context.Background(), c, "refund-1", refunds.Input{PaymentID: "pay_1", Amount: 1500, Reason: "damaged"}, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, res.Run.Status)
	require.Equal(t, refunds.Output{RefundID: "re_1", Remaining: 3500}, res.Output)
	journal := enginetest.RequirePhases(t, c, res.Run.ID, "payment_looked_up", "refund_created", "refund_recorded")
	require.Equal(t, 3, journal[1].Attempts, "two 503s, then the refund")
	b.requireRecordedOnce(t, res.Run, 1500)
	calls, _ := b.gateway.stats()
	require.Equal(t, map[string]int{enginetest.ChildKey(t, res.Run, "refund_created"): 3}, calls)

	select {
	case key := <-b.notices:
		require.Regexp(t, `^refund-notice-\d+$`, key)
	case <-time.After(30 * time.Second):
		t.Fatal("the notice was not delivered")
	}
}

// The crash the issue names: the process dies right after the gateway's
// refund is journaled. The resumed run records it without asking the
// gateway again.
func TestRefundCrashedAfterTheRefundStepIsRecordedOnce(t *testing.T) {
	t.Parallel()
	for _, crashAfter := range []string{"payment_looked_up", "refund_created", "refund_recorded"} {
		t.Run(crashAfter, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			dead := b.client(t)
			res, err := b.refund.Start(enginetest.CrashAfter(ctx, crashAfter), dead, "refund-1", refunds.Input{PaymentID: "pay_1", Amount: 5000, Reason: "duplicate"}, nil)
			require.ErrorIs(t, err, enginetest.ErrCrashed)
			runID := res.Run.ID
			enginetest.RequireStatus(t, dead, runID, engine.StatusRunning) // leased to the dead process

			successor := b.client(t)
			run, err := b.db.Recover(ctx, successor, runID)
			require.NoError(t, err)
			require.Equal(t, engine.StatusSucceeded, run.Status)
			require.Equal(t, 2, run.Attempt)
			require.JSONEq(t, `{"refund_id":"re_1","remaining":0}`, string(run.Output))
			enginetest.RequirePhases(t, successor, runID, "payment_looked_up", "refund_created", "refund_recorded")
			b.requireRecordedOnce(t, run, 5000)
			calls, _ := b.gateway.stats()
			for key, n := range calls {
				require.Equal(t, 1, n, "the gateway was called once for %s: a journaled step is not repeated", key)
			}

			// The client's retry of the request replays the outcome.
			again, err := b.refund.Start(ctx, successor, "refund-1", refunds.Input{PaymentID: "pay_1", Amount: 5000, Reason: "duplicate"}, nil)
			require.NoError(t, err)
			require.Equal(t, engine.OutcomeFinished, again.Outcome)
			require.Equal(t, refunds.Output{RefundID: "re_1", Remaining: 0}, again.Output)
		})
	}
}

func TestRefundOfMoreThanIsLeftFailsWithItsOwnStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t)
	res, err := b.refund.Start(context.Background(), c, "too-much", refunds.Input{PaymentID: "pay_1", Amount: 5001, Reason: "x"}, nil)
	require.NoError(t, err)
	run := enginetest.RequireStatus(t, c, res.Run.ID, engine.StatusFailed)
	require.Equal(t, "not_refundable", run.Error.Code)
	require.Equal(t, http.StatusConflict, *run.ResponseStatus)
	require.Equal(t, 24*time.Hour, run.ExpiresAt.Sub(*run.FinishedAt), "a refused refund is kept a day, not the chargeback window")
	// The refused lookup rolled back its writes; its refusal is journaled.
	phases := enginetest.RequirePhases(t, c, res.Run.ID, "payment_looked_up")
	require.Equal(t, "not_refundable", phases[0].Error.Code)
	_, made := b.gateway.stats()
	require.Zero(t, made)
}
