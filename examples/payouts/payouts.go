// Package payouts is the asynchronous counterpart of the payment example,
// written against the public packages only: a payout asks the bank for a
// transfer and then waits — holding nothing, for days if need be — for
// the bank's settlement webhook, matched by the transfer id the bank
// echoes.
//
//  1. transfer_requested (step): POST /v1/transfers with the step's child
//     key, so a retried or resumed request is the same transfer.
//  2. bank_settled (await): the webhook, delivered as a signal by
//     correlation key = the transfer id (POST /v1/signals/bank_settled
//     ?correlation_key=…, Idempotency-Key = the bank's event id). A webhook
//     that beats the await is kept and consumed at once; a redelivered one
//     is a no-op. No webhook within the deadline fails the payout with
//     settlement_timed_out (504).
//  3. payout_recorded (atomic): the payout row, settled.
package payouts

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
)

// WorkflowName is the name the payout workflow is registered under, and
// SignalSettled the signal its webhook is delivered as.
const (
	WorkflowName  = "payout"
	SignalSettled = "bank_settled"
)

// DefaultSettleTimeout is how long a payout waits for its webhook.
const DefaultSettleTimeout = 72 * time.Hour

// Input asks to pay an amount out to an account.
type Input struct {
	Amount  int64  `json:"amount"`
	Account string `json:"account"`
}

// Output is the settled payout.
type Output struct {
	TransferID string `json:"transfer_id"`
	Status     string `json:"status"`
}

// Settlement is the bank's webhook body.
type Settlement struct {
	TransferID string `json:"transfer_id"`
	Status     string `json:"status"`
}

// Config configures New.
type Config struct {
	// BankURL is the bank's base URL (POST /v1/transfers). Required.
	BankURL string
	// SettleTimeout bounds the wait for the webhook. Defaults to 72 hours.
	SettleTimeout time.Duration
	// HTTP sends the bank's requests. Defaults to steps.NewClient(nil),
	// which sends child keys and trace context.
	HTTP *http.Client
}

// Payouts holds the workflow's dependencies.
type Payouts struct{ cfg Config }

// New returns the payout example. It does no I/O.
func New(cfg Config) (*Payouts, error) {
	if cfg.BankURL == "" {
		return nil, errors.New("payouts: BankURL is required")
	}
	if cfg.SettleTimeout == 0 {
		cfg.SettleTimeout = DefaultSettleTimeout
	}
	if cfg.HTTP == nil {
		cfg.HTTP = steps.NewClient(nil)
	}
	return &Payouts{cfg: cfg}, nil
}

// Register adds the payout workflow: kept for ever (it moves money); 201
// when settled, 504 when the bank never reported, 400 for a bad request.
func (p *Payouts) Register(workflows *engine.Workflows) (*engine.Workflow[Input, Output], error) {
	return engine.Register(workflows, WorkflowName, p.payout, &engine.WorkflowOpts{
		Retention:     engine.RetentionForever,
		ErrorStatuses: map[string]int{"settlement_timed_out": http.StatusGatewayTimeout, "invalid_payout": http.StatusBadRequest},
	})
}

func (p *Payouts) payout(ctx context.Context, in Input) (Output, error) {
	if in.Amount <= 0 || in.Account == "" {
		return Output{}, steps.Permanent("invalid_payout", errors.New("a positive amount and an account are required"))
	}
	transferID, err := engine.Step(ctx, "transfer_requested", func(ctx context.Context, _ steps.Key) (string, error) {
		return p.requestTransfer(ctx, in)
	}, nil)
	if err != nil {
		return Output{}, err
	}
	s, err := engine.Await[Settlement](ctx, SignalSettled, &engine.AwaitOpts{CorrelationKey: transferID, Timeout: p.cfg.SettleTimeout})
	var timeout *engine.AwaitTimeoutError
	if errors.As(err, &timeout) {
		return Output{}, steps.Permanent("settlement_timed_out", fmt.Errorf("transfer %s: %w", transferID, err))
	}
	if err != nil {
		return Output{}, err // parked until the webhook, or a failure
	}
	_, err = engine.Atomic(ctx, "payout_recorded", func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
		info, _ := engine.RunInfoFrom(ctx)
		_, err := tx.Exec(ctx, `INSERT INTO payouts.payouts (run_id, transfer_id, amount, account, status) VALUES ($1, $2, $3, $4, $5)`,
			info.RunID, transferID, in.Amount, in.Account, s.Status)
		return struct{}{}, err
	}, nil)
	if err != nil {
		return Output{}, err
	}
	return Output{TransferID: transferID, Status: s.Status}, nil
}

// requestTransfer calls POST /v1/transfers; the client's transport sends
// the step's child key as Idempotency-Key.
func (p *Payouts) requestTransfer(ctx context.Context, in Input) (string, error) {
	body, _ := json.Marshal(map[string]any{"amount": in.Amount, "account": in.Account})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.cfg.BankURL+"/v1/transfers", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.cfg.HTTP.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if err := steps.CheckResponse(resp); err != nil {
		return "", err
	}
	var t struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&t); err != nil || t.ID == "" {
		return "", fmt.Errorf("payouts: bank answered %d without a transfer id", resp.StatusCode)
	}
	return t.ID, nil
}

// Setup creates the example's table if it does not exist.
func Setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
		SELECT pg_advisory_xact_lock(hashtext('payouts.setup'));
		CREATE SCHEMA IF NOT EXISTS payouts;
		CREATE TABLE IF NOT EXISTS payouts.payouts (
			run_id      text        PRIMARY KEY,
			transfer_id text        NOT NULL UNIQUE,
			amount      bigint      NOT NULL,
			account     text        NOT NULL,
			status      text        NOT NULL,
			recorded_at timestamptz NOT NULL DEFAULT now()
		)`)
	return err
}
