package payments_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/examples/payments"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/testdb"
	"github.com/ratchet-run/ratchet/internal/testproc"
	"github.com/ratchet-run/ratchet/worker"
)

func TestMain(m *testing.M) { testproc.Main(m, deliverReceipts) }

// deliverReceipts is a receipt delivery process: it works the receipts
// queue until killed.
func deliverReceipts() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	w, err := newWorker(payments.Config{Pool: pool, GatewayURL: os.Getenv("GATEWAY_URL"), MailURL: os.Getenv("MAIL_URL")})
	if err != nil {
		return err
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	fmt.Println("READY")
	select {}
}

type testBundle struct {
	pool    *pgxpool.Pool
	url     string
	gateway *fakes.Gateway
	mail    *fakes.Mail
	gwURL   string
	mailURL string
}

func setup(t *testing.T, mailOpts *fakes.MailOpts) *testBundle {
	t.Helper()
	b := &testBundle{url: testdb.NewURL(t), gateway: fakes.NewGateway(nil), mail: fakes.NewMail(mailOpts)}
	b.pool = testdb.Connect(t, b.url, nil)
	require.NoError(t, payments.Setup(context.Background(), b.pool))
	gw, mail := httptest.NewServer(b.gateway), httptest.NewServer(b.mail)
	t.Cleanup(gw.Close)
	t.Cleanup(mail.Close)
	b.gwURL, b.mailURL = gw.URL, mail.URL
	return b
}

// newWorker is a process's worker with the payment workflow and the
// receipt delivery worker.
func newWorker(cfg payments.Config) (*worker.Worker, error) {
	p, err := payments.New(cfg)
	if err != nil {
		return nil, err
	}
	workflows := engine.NewWorkflows()
	if _, err := p.Register(workflows); err != nil {
		return nil, err
	}
	workers := river.NewWorkers()
	if err := p.AddWorkers(workers); err != nil {
		return nil, err
	}
	return worker.New(cfg.Pool, &worker.Config{
		Engine:  engine.Config{Workflows: workflows},
		Workers: workers,
		Queues:  map[string]river.QueueConfig{payments.QueueReceipts: {MaxWorkers: 2}},
	})
}

// config is the example's configuration against the bundle's fakes.
func (b *testBundle) config() payments.Config {
	return payments.Config{Pool: b.pool, GatewayURL: b.gwURL, MailURL: b.mailURL}
}

// startWorker runs a worker in this process until the test ends.
func (b *testBundle) startWorker(t *testing.T) *worker.Worker {
	t.Helper()
	return b.startWorkerWith(t, b.config())
}

func (b *testBundle) startWorkerWith(t *testing.T, cfg payments.Config) *worker.Worker {
	t.Helper()
	w, err := newWorker(cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	return w
}

// inlineClient executes payments but works no jobs.
func (b *testBundle) inlineClient(t *testing.T) *engine.Client {
	t.Helper()
	p, err := payments.New(b.config())
	require.NoError(t, err)
	workflows := engine.NewWorkflows()
	_, err = p.Register(workflows)
	require.NoError(t, err)
	c, err := engine.NewClient(b.pool, &engine.Config{Workflows: workflows})
	require.NoError(t, err)
	return c
}

func pay(t *testing.T, c *engine.Client, key string, in payments.Input) *engine.Run {
	t.Helper()
	input, err := json.Marshal(in)
	require.NoError(t, err)
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: payments.WorkflowName, IdempotencyKey: key, Input: input})
	require.NoError(t, err)
	return res.Run
}

var card = payments.Input{Amount: 1299, Currency: "usd", Customer: "cus_123", Email: "a@example.com"}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func TestPaymentPostsLedgerAndDeliversOneReceipt(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	w := b.startWorker(t)
	run := pay(t, w.Engine(), "order-1", card)
	require.Equal(t, engine.StatusSucceeded, run.Status, "%+v", run.Error)
	require.Equal(t, 201, *run.ResponseStatus)
	var out payments.Output
	require.NoError(t, json.Unmarshal(run.Output, &out))
	require.Equal(t, "succeeded", out.Status)
	require.Equal(t, "ch_000001", out.ChargeID)

	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM payments.ledger_entries WHERE payment_id = $1`, out.PaymentID))
	require.Equal(t, 0, b.count(t, `SELECT coalesce(sum(amount), 0) FROM payments.ledger_entries`), "the ledger sums to zero")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments.payments WHERE status = 'succeeded' AND charge_id = $1`, out.ChargeID))
	require.Eventually(t, func() bool { return b.mail.Stats().Deliveries == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return b.count(t, `SELECT count(*) FROM payments.receipts`) == 1 }, 10*time.Second, 10*time.Millisecond)

	again := pay(t, w.Engine(), "order-1", card)
	require.Equal(t, run.Output, again.Output, "a retry replays")
	require.Equal(t, 1, b.gateway.Stats().Charges)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM payments.ledger_entries`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ratchet.river_job WHERE kind = 'payments.receipt'`), "one receipt staged")
}

func TestDeclinedCardFailsWith402AndNoLedgerOrEmail(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.inlineClient(t)
	declined := card
	declined.Customer = fakes.DeclinedCustomer
	run := pay(t, c, "order-1", declined)
	require.Equal(t, engine.StatusFailed, run.Status)
	require.Equal(t, "card_declined", run.Error.Code)
	require.Equal(t, 402, *run.ResponseStatus)

	again := pay(t, c, "order-1", declined)
	require.Equal(t, run.Error, again.Error, "the decline is replayed")
	require.Len(t, b.gateway.Requests(), 1, "one gateway call")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM payments.ledger_entries`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM ratchet.river_job WHERE kind = 'payments.receipt'`), "no email")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments.payments WHERE status = 'declined'`))
}

func TestInvalidPaymentIsRefusedWith400(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.inlineClient(t)
	run := pay(t, c, "order-1", payments.Input{Amount: -1, Currency: "US dollars", Customer: "cus_1", Email: "nope"})
	require.Equal(t, engine.StatusFailed, run.Status)
	require.Equal(t, "invalid_payment", run.Error.Code)
	require.Equal(t, 400, *run.ResponseStatus)

	// The customer keys the per-customer limit, so a payment without one
	// is refused at the start, before a run exists (400 invalid_input
	// over HTTP).
	input, err := json.Marshal(payments.Input{Amount: 1, Currency: "usd", Email: "a@example.com"})
	require.NoError(t, err)
	_, err = c.Start(context.Background(), engine.StartParams{Workflow: payments.WorkflowName, IdempotencyKey: "order-2", Input: input})
	require.ErrorIs(t, err, engine.ErrInvalidInput)
	require.ErrorContains(t, err, `"customer"`)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM ratchet.runs`))
	require.Empty(t, b.gateway.Requests())
}

func TestNewRefusesANegativeCustomerLimit(t *testing.T) {
	t.Parallel()
	_, err := payments.New(payments.Config{Pool: &pgxpool.Pool{}, GatewayURL: "http://gw", MailURL: "http://mail", CustomerLimit: -1})
	require.ErrorContains(t, err, "CustomerLimit -1")
}

// A customer's payments run at most CustomerLimit at once: with every
// charge held at the gateway for a while, eight payments started at once
// for one customer overlap there at most twice, and all are charged once.
func TestACustomersPaymentsRunAtMostCustomerLimitAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.gateway.SetFaults(fakes.Faults{Latency: 100 * time.Millisecond})
	cfg := b.config()
	cfg.CustomerLimit = 2
	w := b.startWorkerWith(t, cfg)
	var wg sync.WaitGroup
	ids := make([]string, 10)
	for i := range ids {
		in := card
		if i >= 8 {
			in.Customer = "cus_other"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			input, _ := json.Marshal(in)
			res, err := w.Engine().Start(context.Background(), engine.StartParams{Workflow: payments.WorkflowName, IdempotencyKey: fmt.Sprintf("order-%d", i), Input: input})
			if err == nil {
				ids[i] = res.Run.ID
			}
		}()
	}
	wg.Wait()
	for i, id := range ids {
		require.NotEmpty(t, id, "payment %d was started", i)
		require.Eventually(t, func() bool {
			run, err := w.Engine().GetRun(context.Background(), id)
			return err == nil && run.Status == engine.StatusSucceeded
		}, 60*time.Second, 20*time.Millisecond, "payment %d succeeds", i)
	}
	stats := b.gateway.Stats()
	require.Equal(t, 10, stats.Charges)
	require.Len(t, stats.ChargesByKey, 10, "one charge per payment")
	require.LessOrEqual(t, stats.MaxInFlightByCustomer[card.Customer], 2, "the limit held at the gateway")
	require.Zero(t, b.count(t, `SELECT count(*) FROM ratchet.runs WHERE holds_slot`), "every slot given back")
}

// The one duplicate left: a delivery process killed after the mail service
// accepted the receipt and before the delivery was recorded. River rescues
// the job and the receipt is sent again — with the same message id, and
// with the worker's default settings within a minute (docs/recovery.md).
func TestReceiptResentWithSameMessageIDAfterKillBetweenSendAndRecord(t *testing.T) {
	t.Parallel()
	delivered := make(chan string, 10)
	hold := make(chan struct{})
	var deliveries atomic.Int32
	b := setup(t, &fakes.MailOpts{AfterDelivery: func(m fakes.Message) {
		delivered <- m.MessageID
		if deliveries.Add(1) == 1 {
			<-hold // the first answer waits until its sender is dead
		}
	}})
	defer close(hold)
	run := pay(t, b.inlineClient(t), "order-1", card)
	require.Equal(t, engine.StatusSucceeded, run.Status)

	deliverer := testproc.Start(t, "READY", "DATABASE_URL="+b.url, "GATEWAY_URL="+b.gwURL, "MAIL_URL="+b.mailURL)

	var first string
	select {
	case first = <-delivered:
	case <-time.After(30 * time.Second):
		t.Fatal("the receipt was never sent")
	}
	deliverer.Signal(syscall.SIGKILL)
	killed := time.Now()
	deliverer.Wait()
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM payments.receipts`), "the delivery was never recorded")

	// Another process rescues the job once it counts as stuck. The killed
	// process was River's leader, so the survivor must be elected first.
	b.startWorker(t)
	var second string
	select {
	case second = <-delivered:
	case <-time.After(time.Minute):
		t.Fatal("the receipt was not resent within a minute")
	}
	t.Logf("receipt resent %s after its delivery process was killed", time.Since(killed).Round(100*time.Millisecond))
	require.Equal(t, first, second, "resent with the same message id")
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM payments.receipts WHERE message_id = $1`, first) == 1
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 2, b.mail.Stats().DeliveriesByMessageID[first])
}

// Replicas started together on a fresh database all set up.
func TestSetupFromManyProcessesAtOnce(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t, &testdb.Options{MaxConns: 10})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- payments.Setup(context.Background(), pool)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// A ledger that refuses the payment after the card was charged (the
// customer's account was closed meanwhile): the charge is refunded once,
// under the refund's own child key, and the run ends compensated with the
// refusal as its cause.
func TestALedgerRefusalAfterTheChargeRefundsItOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.inlineClient(t)
	_, err := b.pool.Exec(context.Background(), `INSERT INTO payments.closed_accounts (customer) VALUES ('cus_closed')`)
	require.NoError(t, err)
	closed := card
	closed.Customer = "cus_closed"
	run := pay(t, c, "order-1", closed)
	require.Equal(t, engine.StatusCompensated, run.Status)
	require.Equal(t, payments.CodeAccountClosed, run.Error.Code)
	require.Equal(t, 409, *run.ResponseStatus)
	require.JSONEq(t, `{"compensated": ["charge_created"]}`, string(run.Output))

	stats := b.gateway.Stats()
	require.Equal(t, 1, stats.Charges)
	require.Equal(t, map[string]int{"ch_000001": 1}, stats.RefundsByCharge, "refunded once")
	require.Equal(t, 1, stats.RefundsByKey[enginetest.ChildKey(t, run, "undo:charge_created")])
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM payments.ledger_entries`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments.payments WHERE status = 'refused' AND charge_id = 'ch_000001'`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM ratchet.river_job WHERE kind = 'payments.receipt'`), "no receipt")

	again := pay(t, c, "order-1", closed)
	require.Equal(t, run.Output, again.Output, "replayed")
	require.Equal(t, 1, b.gateway.Stats().Refunds)
}

// The gateway charged, and its answer was lost: the step asks the gateway
// for the charge made with its key rather than charging again.
func TestALostChargeAnswerIsReconciled(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.gateway.SetFaults(fakes.Faults{DropAfter: 1})
	run := pay(t, b.inlineClient(t), "order-1", card)
	require.Equal(t, engine.StatusSucceeded, run.Status, "%+v", run.Error)
	key := enginetest.ChildKey(t, run, "charge_created")
	stats := b.gateway.Stats()
	require.Equal(t, 1, stats.RequestsByKey[key], "sent once")
	require.Equal(t, 1, stats.ReconcileQueries)
	require.Equal(t, 1, stats.Charges)
}
