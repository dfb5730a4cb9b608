package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/ratchet-run/ratchet/internal/fakes"
)

type fakesCmd struct {
	GatewayAddr   string        `name:"gateway-addr" env:"RATCHET_GATEWAY_ADDR" default:"127.0.0.1:4242" help:"Address the fake gateway listens on (env RATCHET_GATEWAY_ADDR)."`
	MailAddr      string        `name:"mail-addr" env:"RATCHET_MAIL_ADDR" default:"127.0.0.1:4243" help:"Address the fake mail service listens on (env RATCHET_MAIL_ADDR)."`
	FailBefore    int           `name:"fail-before" help:"For each idempotency key, answer the first N charges 500 without charging."`
	DropAfter     int           `name:"drop-after" help:"For each idempotency key, charge on the next N requests and close the connection without answering."`
	Latency       time.Duration `name:"latency" help:"Delay every charge by this long."`
	KeyWindow     time.Duration `name:"key-window" help:"Forget an idempotency key this long after its first use, as real gateways do (a charge repeated later is a new charge); 0 remembers keys for ever."`
	RefuseRefunds bool          `name:"refuse-refunds" help:"Refuse every refund (400 charge_disputed), to see a compensation stuck for an operator."`
	BankAddr      string        `name:"bank-addr" env:"RATCHET_BANK_ADDR" default:"127.0.0.1:4244" help:"Address the fake bank listens on (env RATCHET_BANK_ADDR)."`
	WebhookURL    string        `name:"webhook-url" default:"http://127.0.0.1:8080/v1/signals/bank_settled" help:"Where the fake bank sends its settlement webhooks: the Ratchet API's signal endpoint."`
	SettleAfter   time.Duration `name:"settle-after" default:"1s" help:"How long after a transfer the bank sends its webhook."`
}

func (c *fakesCmd) Run(e *env) error {
	if c.KeyWindow < 0 {
		return fmt.Errorf("--key-window %s is negative", c.KeyWindow)
	}
	gw := fakes.NewGateway(&fakes.GatewayOpts{KeyWindow: c.KeyWindow,
		Faults: fakes.Faults{FailBefore: c.FailBefore, DropAfter: c.DropAfter, Latency: c.Latency, RefuseRefunds: c.RefuseRefunds}})
	gwLn, err := net.Listen("tcp", c.GatewayAddr)
	if err != nil {
		return fmt.Errorf("fake gateway cannot listen on %s: %s", c.GatewayAddr, reason(err))
	}
	mailLn, err := net.Listen("tcp", c.MailAddr)
	if err != nil {
		gwLn.Close()
		return fmt.Errorf("fake mail service cannot listen on %s: %s", c.MailAddr, reason(err))
	}
	bankLn, err := net.Listen("tcp", c.BankAddr)
	if err != nil {
		gwLn.Close()
		mailLn.Close()
		return fmt.Errorf("fake bank cannot listen on %s: %s", c.BankAddr, reason(err))
	}
	fmt.Fprintf(e.stdout, "fake gateway listening on http://%s (POST /v1/charges, GET /v1/charges?idempotency_key=, GET /stats, PUT /faults)\n", gwLn.Addr())
	fmt.Fprintf(e.stdout, "fake mail service listening on http://%s (POST /v1/messages, GET /stats)\n", mailLn.Addr())
	fmt.Fprintf(e.stdout, "fake bank listening on http://%s (POST /v1/transfers; webhooks to %s after %s)\n", bankLn.Addr(), c.WebhookURL, c.SettleAfter)
	bank := fakes.NewBank(fakes.BankOpts{WebhookURL: c.WebhookURL, Webhooks: fakes.Webhooks{Delay: c.SettleAfter}})
	errc := make(chan error, 3)
	go func() { errc <- serve(e.ctx, gwLn, gw) }()
	go func() { errc <- serve(e.ctx, mailLn, fakes.NewMail(nil)) }()
	go func() { errc <- serve(e.ctx, bankLn, bank) }()
	return errors.Join(<-errc, <-errc, <-errc)
}

// serve runs handler on ln until ctx ends, then shuts down gracefully.
func serve(ctx context.Context, ln net.Listener, handler http.Handler) error {
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
