package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oklog/ulid/v2"

	"github.com/ratchet-run/ratchet/examples/payouts"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/pgboot"
	"github.com/ratchet-run/ratchet/internal/telemetry"
	"github.com/ratchet-run/ratchet/migrations"
)

type devCmd struct {
	DatabaseURL string        `name:"database-url" env:"DATABASE_URL" help:"Postgres connection string (env DATABASE_URL). Unset: 127.0.0.1:5432 if it answers, else a throwaway cluster started from the installed Postgres."`
	Addr        string        `name:"addr" env:"RATCHET_ADDR" default:"127.0.0.1:8080" help:"Address the API listens on (env RATCHET_ADDR)."`
	StaleAfter  time.Duration `name:"stale-after" env:"RATCHET_STALE_AFTER" default:"5s" help:"Lease length (env RATCHET_STALE_AFTER)."`
	Demo        bool          `name:"demo" default:"true" negatable:"" help:"Make a payment, replay it, reuse its key wrongly and decline a card through the API, and print what happened."`
	TraceStdout bool          `name:"trace-stdout" help:"Print every span (runs, phases, requests, jobs) to stdout as JSON, besides any OTEL_* exporter."`

	// probeURL is where dev looks for a running Postgres when no
	// DATABASE_URL is set; tests point it at a port where none answers.
	probeURL string
}

func (c *devCmd) Run(e *env) error {
	ctx := e.ctx
	out := func(format string, args ...any) { fmt.Fprintf(e.stdout, format+"\n", args...) }

	dsn, stopCluster, err := c.database(ctx, out)
	if err != nil {
		return err
	}
	defer stopCluster()
	flags := appFlags{StaleAfter: c.StaleAfter, MaxInline: 32, KeyFormat: 3, CommitWindow: 500 * time.Microsecond}
	logger := newLogger(e.stderr, slog.LevelWarn)
	pool, err := (&dbFlags{DatabaseURL: dsn, conns: workerConfig(flags, true).Connections(), log: logger}).connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := migrations.Apply(ctx, pool, nil)
	if err != nil {
		return err
	}
	out("migrated (%d Ratchet and %d River migrations applied now)", len(res.Applied), len(res.RiverVersions))
	if err := setUp(ctx, pool, demoBalances); err != nil {
		return err
	}

	// The downstreams, in this process.
	gateway, mail := fakes.NewGateway(nil), fakes.NewMail(nil)
	gwLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mailLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go serve(ctx, gwLn, gateway) //nolint:errcheck // ends with ctx
	go serve(ctx, mailLn, mail)  //nolint:errcheck // ends with ctx
	// The bank settles a payout a second after its transfer, by a webhook
	// to the API (sent twice, as banks do): made once the API listens.
	var bank atomic.Pointer[fakes.Bank]
	bankLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go serve(ctx, bankLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { bank.Load().ServeHTTP(w, r) })) //nolint:errcheck // ends with ctx

	topts := &telemetry.Options{}
	if c.TraceStdout {
		topts.TraceOut = e.stdout
	}
	shutdown, err := telemetry.Setup(ctx, topts)
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	defer shutdown(context.WithoutCancel(ctx)) //nolint:errcheck // best effort at exit
	flags.GatewayURL, flags.MailURL, flags.BankURL = "http://"+gwLn.Addr().String(), "http://"+mailLn.Addr().String(), "http://"+bankLn.Addr().String()
	a, err := newApp(pool, flags, true, logger)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("API cannot listen on %s: %s (set --addr or RATCHET_ADDR)", c.Addr, reason(err))
	}
	if err := a.worker.Start(ctx); err != nil {
		ln.Close()
		return err
	}
	srv := a.handler.NewServer(c.Addr, nil)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	base := "http://" + ln.Addr().String()
	bank.Store(fakes.NewBank(fakes.BankOpts{WebhookURL: base + "/v1/signals/" + payouts.SignalSettled, Webhooks: fakes.Webhooks{Delay: time.Second, Twice: true}}))

	out("")
	out("Ratchet is running:")
	out("  API           %s  (no authentication: tenant \"default\")", base)
	out("  runs page     %s/ui/  (and: ratchet runs list --server %s)", base, base)
	out("  worker        resumes crashed runs after %s, delivers receipts", c.StaleAfter)
	out("  fake gateway  http://%s/stats", gwLn.Addr())
	out("  fake mail     http://%s/stats", mailLn.Addr())
	out("  fake bank     http://%s (settles payouts by webhook a second later)", bankLn.Addr())
	out("")
	out("Make a payment (run it twice: the second is a replay):")
	out("  curl -i -X POST %s/v1/workflows/payment/runs \\", base)
	out("    -H 'Idempotency-Key: order-1' -H 'Content-Type: application/json' \\")
	out(`    -d '{"amount": 1299, "currency": "usd", "customer": "cus_123", "email": "a@example.com"}'`)
	out("")
	if c.Demo {
		if err := demo(ctx, base, gateway, mail, &bank, out); err != nil {
			out("demo: %v", err)
		}
	}
	out("ready; Ctrl-C stops")

	select {
	case err := <-errc:
		_ = stopApp(a, nil)
		return err
	case <-ctx.Done():
	}
	out("shutting down")
	return stopApp(a, srv)
}

// database returns the DSN to use, and a function that stops the
// throwaway cluster if one was started.
func (c *devCmd) database(ctx context.Context, out func(string, ...any)) (string, func(), error) {
	if c.DatabaseURL != "" {
		return c.DatabaseURL, func() {}, nil
	}
	probe := c.probeURL
	if probe == "" {
		probe = defaultDatabaseURL
	}
	where := (&dbFlags{DatabaseURL: probe}).where()
	pingCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if pool, err := pgxpool.New(pingCtx, probe); err == nil {
		err = pool.Ping(pingCtx)
		pool.Close()
		if err == nil {
			out("using Postgres at %s", where)
			return probe, func() {}, nil
		}
	}
	out("no Postgres answers at %s; starting a throwaway cluster...", where)
	cluster, err := pgboot.Start(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("cannot start a throwaway Postgres: %w", err)
	}
	out("started Postgres from %s in %s (deleted on exit)", cluster.Bin, cluster.Dir)
	return cluster.URL, func() {
		if err := cluster.Stop(); err != nil {
			out("stopping the throwaway Postgres: %v", err)
		}
	}, nil
}

// demo exercises the API as a client would and prints what it saw.
func demo(ctx context.Context, base string, gateway *fakes.Gateway, mail *fakes.Mail, bank *atomic.Pointer[fakes.Bank], out func(string, ...any)) error {
	key := "demo-" + strings.ToLower(ulid.Make().String())
	payment := `{"amount": 1299, "currency": "usd", "customer": "cus_123", "email": "a@example.com"}`
	post := func(key, body string) (int, http.Header, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/workflows/payment/runs", strings.NewReader(body))
		if err != nil {
			return 0, nil, "", err
		}
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		var compact bytes.Buffer
		if json.Compact(&compact, b) == nil {
			b = compact.Bytes()
		}
		return resp.StatusCode, resp.Header, string(b), err
	}

	out("Demo:")
	status, _, body, err := post(key, payment)
	if err != nil {
		return err
	}
	out("  1. payment with Idempotency-Key %s -> %d", key, status)
	out("     %s", body)
	status, h, body2, err := post(key, payment)
	if err != nil {
		return err
	}
	out("  2. the same request again -> %d, Idempotent-Replayed: %s, body identical: %t", status, h.Get("Idempotent-Replayed"), body2 == body)
	status, _, body, err = post(key, strings.Replace(payment, "1299", "5000", 1))
	if err != nil {
		return err
	}
	out("  3. the same key, another amount -> %d %s", status, body)
	status, _, body, err = post(key+"-declined", `{"amount": 500, "currency": "usd", "customer": "cus_declined", "email": "b@example.com"}`)
	if err != nil {
		return err
	}
	out("  4. a declined card -> %d %s", status, body)
	status, _, body, err = post(key+"-refused", `{"amount": 700, "currency": "usd", "customer": "`+demoClosedAccount+`", "email": "c@example.com"}`)
	if err != nil {
		return err
	}
	out("  5. charged, then refused by the ledger (the account is closed) -> %d %s", status, body)
	deadline := time.Now().Add(5 * time.Second)
	for mail.Stats().Deliveries == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	gs := gateway.Stats()
	out("  gateway: %d charge(s), %d refund(s); mail: %d receipt(s) delivered", gs.Charges, gs.Refunds, mail.Stats().Deliveries)

	// A payout: the run waits, holding nothing, for the bank's webhook.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/workflows/payout/runs", strings.NewReader(`{"amount": 5000, "account": "acct_123"}`))
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key+"-payout")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	var run struct {
		Status     string `json:"status"`
		WaitingFor *struct {
			Phase string `json:"phase"`
		} `json:"waiting_for"`
		Output json.RawMessage `json:"output"`
	}
	err = json.NewDecoder(resp.Body).Decode(&run)
	resp.Body.Close()
	if err != nil || run.WaitingFor == nil {
		return fmt.Errorf("payout: %d %s, not waiting", resp.StatusCode, run.Status)
	}
	location := resp.Header.Get("Location")
	out("  6. a payout -> %d %s for %s (the bank's webhook is on its way)", resp.StatusCode, run.Status, run.WaitingFor.Phase)
	for deadline := time.Now().Add(10 * time.Second); run.Status != "succeeded" && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond) // a client polling its run, as any would
		resp, err := http.Get(base + location)
		if err != nil {
			return err
		}
		err = json.NewDecoder(resp.Body).Decode(&run)
		resp.Body.Close()
		if err != nil {
			return err
		}
	}
	bank.Load().Wait()
	out("     then -> %s %s; webhooks received: %d (the second a replay)", run.Status, run.Output, bank.Load().Stats().WebhooksSent)
	out("")
	return nil
}
