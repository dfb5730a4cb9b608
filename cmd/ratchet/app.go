package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/ratchet-run/ratchet/api"
	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/examples/orders"
	"github.com/ratchet-run/ratchet/examples/payments"
	"github.com/ratchet-run/ratchet/examples/payouts"
	"github.com/ratchet-run/ratchet/examples/quickstart"
	"github.com/ratchet-run/ratchet/worker"
)

// appFlags configure the Ratchet service that serve, worker and dev run:
// the example workflows, their downstreams, the engine and the API.
type appFlags struct {
	StaleAfter         time.Duration `name:"stale-after" env:"RATCHET_STALE_AFTER" default:"30s" help:"Lease length: how long a run whose executor died waits before another process takes it over (env RATCHET_STALE_AFTER)."`
	GatewayURL         string        `name:"gateway-url" env:"RATCHET_GATEWAY_URL" default:"http://127.0.0.1:4242" help:"Payment gateway base URL (env RATCHET_GATEWAY_URL)."`
	MailURL            string        `name:"mail-url" env:"RATCHET_MAIL_URL" default:"http://127.0.0.1:4243" help:"Mail service base URL (env RATCHET_MAIL_URL)."`
	BankURL            string        `name:"bank-url" env:"RATCHET_BANK_URL" default:"http://127.0.0.1:4244" help:"Bank base URL for the payout example, whose settlement webhooks come back as signals (env RATCHET_BANK_URL)."`
	Tokens             string        `name:"tokens" env:"RATCHET_TOKENS" help:"API bearer tokens as token=tenant pairs, comma separated (env RATCHET_TOKENS). None: no authentication, tenant \"default\"."`
	MaxInline          int           `name:"max-inline" env:"RATCHET_MAX_INLINE" default:"32" help:"Runs the API executes inline at once; a start beyond it is answered 202 and left to a worker. Sizes the database pool with the worker's settings (env RATCHET_MAX_INLINE)."`
	CommitWindow       time.Duration `name:"commit-window" env:"RATCHET_COMMIT_WINDOW" default:"500us" help:"How long a run's start, a step's result or a run's finish may wait for those of other runs this process executes, to be committed together in one round trip; 0 commits each alone (env RATCHET_COMMIT_WINDOW; docs/performance.md)."`
	PollOnly           bool          `name:"poll-only" env:"RATCHET_POLL_ONLY" help:"River polls for jobs instead of LISTENing: for a database URL that goes through a transaction pooler such as PgBouncer (env RATCHET_POLL_ONLY; docs/performance.md)."`
	CustomerLimit      int           `name:"customer-limit" env:"RATCHET_CUSTOMER_LIMIT" default:"10" help:"How many of one customer's payments run at once; the rest queue in arrival order (env RATCHET_CUSTOMER_LIMIT; docs/concurrency.md)."`
	GatewayConcurrency int           `name:"gateway-concurrency" env:"RATCHET_GATEWAY_CONCURRENCY" default:"20" help:"Runs of the gateway queue executing at once across every process: a payment started with the header Ratchet-Queue: gateway waits in it for room (env RATCHET_GATEWAY_CONCURRENCY; docs/queues.md)."`
	GatewayRate        int           `name:"gateway-rate" env:"RATCHET_GATEWAY_RATE" default:"25" help:"Starts a second the gateway queue allows across every process, the provider's rate limit (env RATCHET_GATEWAY_RATE; docs/queues.md)."`
	KeyFormat          int           `name:"key-format" env:"RATCHET_KEY_FORMAT" default:"0" enum:"0,1,2,3" help:"Child-key format of the runs this process creates: 0, the default, is the database's (3 for a database this release migrated first, 1 for an older one; ratchet.settings); 2 names the run in the key and needs no index of every key sent; 3 names the request, so a run lost in a failover and created again by the client's retry sends the same keys; set 2 or 3 once no older release runs against the database (env RATCHET_KEY_FORMAT; docs/steps.md)."`
}

// workerConfig is the service's worker configuration but for what newApp
// wires (workflows, River workers, logger): enough to size the pool.
func workerConfig(f appFlags, work bool) *worker.Config {
	return &worker.Config{
		Engine: engine.Config{StaleAfter: f.StaleAfter, MaxInline: f.MaxInline, RunGauges: work, KeyFormat: f.KeyFormat,
			CommitWindow: commitWindow(f.CommitWindow), Queues: []engine.Queue{gatewayQueue(f)}},
		InsertOnly: !work,
		PollOnly:   f.PollOnly,
		Queues:     map[string]river.QueueConfig{payments.QueueReceipts: {MaxWorkers: 10}},
	}
}

// gatewayQueue is the service's one queue: runs started into it (over
// HTTP, Ratchet-Queue: gateway) share the payment provider's capacity,
// however many processes serve them — a batch of payments is paced
// rather than refused by the provider.
func gatewayQueue(f appFlags) engine.Queue {
	q := engine.Queue{Name: payments.GatewayQueue, Concurrency: f.GatewayConcurrency}
	if f.GatewayRate != 0 {
		q.Rate = engine.Rate{Limit: f.GatewayRate, Period: time.Second}
	}
	return q
}

// commitWindow maps the flag (0: off) to engine.Config.CommitWindow (0:
// the default, negative: off).
func commitWindow(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// app is a running service's parts.
type app struct {
	worker  *worker.Worker
	handler *api.Handler
	pool    *pgxpool.Pool
}

func parseTokens(s string) (map[string]string, error) {
	tokens := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		if pair = strings.TrimSpace(pair); pair == "" {
			continue
		}
		token, tenant, ok := strings.Cut(pair, "=")
		if !ok || token == "" || tenant == "" {
			return nil, fmt.Errorf("bad --tokens entry %q: want token=tenant", redactToken(pair))
		}
		tokens[token] = tenant
	}
	return tokens, nil
}

// redactToken keeps an error message from echoing a secret.
func redactToken(pair string) string {
	if len(pair) <= 4 {
		return "****"
	}
	return pair[:2] + "…"
}

// registry is this build's workflows: the examples, each at the versions
// it registers. serve, worker and dev run them; check-deploy checks the
// runs in flight against them.
func registry(pool *pgxpool.Pool, f appFlags) (*engine.Workflows, *payments.Payments, error) {
	workflows := engine.NewWorkflows()
	pay, err := payments.New(payments.Config{Pool: pool, GatewayURL: f.GatewayURL, MailURL: f.MailURL, CustomerLimit: f.CustomerLimit})
	if err != nil {
		return nil, nil, err
	}
	if _, err := pay.Register(workflows); err != nil {
		return nil, nil, err
	}
	if err := orders.Register(workflows); err != nil {
		return nil, nil, err
	}
	if _, err := quickstart.Register(workflows); err != nil {
		return nil, nil, err
	}
	payout, err := payouts.New(payouts.Config{BankURL: f.BankURL})
	if err != nil {
		return nil, nil, err
	}
	if _, err := payout.Register(workflows); err != nil {
		return nil, nil, err
	}
	return workflows, pay, nil
}

// newApp wires the example workflows, a worker (insert-only when work is
// false) and the API over pool, which must be migrated and set up.
func newApp(pool *pgxpool.Pool, f appFlags, work bool, logger *slog.Logger) (*app, error) {
	workflows, pay, err := registry(pool, f)
	if err != nil {
		return nil, err
	}
	riverWorkers := river.NewWorkers()
	if err := pay.AddWorkers(riverWorkers); err != nil {
		return nil, err
	}
	cfg := workerConfig(f, work)
	cfg.Engine.Workflows, cfg.Engine.Logger, cfg.Engine.Hooks = workflows, logger, crashHooks()
	cfg.Workers, cfg.Logger = riverWorkers, logger
	w, err := worker.New(pool, cfg)
	if err != nil {
		return nil, err
	}
	tokens, err := parseTokens(f.Tokens)
	if err != nil {
		return nil, err
	}
	h, err := api.New(&api.Config{Engine: w.Engine(), Tokens: tokens, Logger: logger})
	if err != nil {
		return nil, err
	}
	return &app{worker: w, handler: h, pool: pool}, nil
}

// demoBalances are the accounts dev opens for the quickstart transfer.
var demoBalances = map[string]int64{"alice": 1_000_000, "bob": 0}

// demoClosedAccount is the customer whose ledger account dev closes: the
// ledger refuses their payments after the charge, which is refunded.
const demoClosedAccount = "cus_closed"

// setUp creates the example workflows' tables, and opens balances (demo
// data: dev's only, never seeded into a database serve is pointed at;
// with them, dev closes demoClosedAccount).
func setUp(ctx context.Context, pool *pgxpool.Pool, balances map[string]int64) error {
	if err := payments.Setup(ctx, pool); err != nil {
		return err
	}
	if balances != nil {
		if _, err := pool.Exec(ctx, `INSERT INTO payments.closed_accounts (customer) VALUES ($1) ON CONFLICT DO NOTHING`, demoClosedAccount); err != nil {
			return fmt.Errorf("close the demo account: %w", err)
		}
	}
	if err := payouts.Setup(ctx, pool); err != nil {
		return err
	}
	if err := orders.Setup(ctx, pool); err != nil {
		return err
	}
	return quickstart.Setup(ctx, pool, balances)
}

// stopApp stops the server (if any) and the worker gracefully: requests
// waiting for an inline execution are answered 202 at once, the server
// drains, then the worker's grace runs and hands over what is left. It ends
// within the worker's grace and a second, whatever the clients asked.
func stopApp(a *app, srv *http.Server) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a.handler.Drain()
	var firstErr error
	if srv != nil {
		if err := srv.Shutdown(ctx); err != nil {
			firstErr = err
		}
	}
	if err := a.worker.Stop(ctx); err != nil && firstErr == nil {
		firstErr = err
	}
	return firstErr
}
