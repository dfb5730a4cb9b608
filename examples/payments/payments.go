// Package payments is the scenario Ratchet exists for, written as a user of
// the public packages would write it: a payment workflow that records a
// payment, charges a gateway with a derived child idempotency key, then posts
// a double-entry ledger and stages the receipt email in one transaction —
// the email through a transactional outbox (a River job inserted in the
// phase's transaction), because the mail service knows no idempotency keys.
//
// The payment is a saga. The charge registers its refund, and posting the
// ledger is the pivot: a ledger that refuses the payment (the customer's
// account was closed meanwhile) or a cancellation before it refunds the
// charge, under the refund's own child key; once the ledger is posted,
// the payment is kept and only goes forward. A charge whose answer was
// lost is reconciled — the gateway is asked by key — rather than sent
// again, and a resume past the gateway's 24-hour key window never charges
// blindly.
//
// A retry, a crash anywhere, or a client storm never charges twice, never
// posts the ledger twice and never stages two receipts. The one duplicate
// left is the delivery worker dying between sending an email and recording
// it: the email is then sent again with the same message id (the charge's
// id), which a mail service that can deduplicate will honour.
package payments

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/mail"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oklog/ulid/v2"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/migrations"
	"github.com/ratchet-run/ratchet/steps"
)

// WorkflowName is the name the payment workflow is registered under.
const WorkflowName = "payment"

// CodeAccountClosed is the error code of a payment the ledger refuses: the
// customer's account was closed (payments.closed_accounts) after the
// payment began. The charge is refunded.
const CodeAccountClosed = "account_closed"

// GatewayKeyWindow is how long the gateway keeps idempotency keys (Stripe
// keeps them at least 24 hours): a charge retried later could be a second
// charge, so the engine reconciles instead.
const GatewayKeyWindow = 24 * time.Hour

// QueueReceipts is the River queue of receipt deliveries.
const QueueReceipts = "receipts"

// GatewayQueue is the name of the Ratchet queue a service may declare for
// payments that should be paced to the provider's capacity (a batch, an
// import): the payment workflow is in no queue by default, and a start
// names this one to wait in it (StartParams.Queue; over HTTP the header
// Ratchet-Queue).
const GatewayQueue = "gateway"

// Input is the payment request.
type Input struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Customer string `json:"customer"`
	Email    string `json:"email"`
}

// Output is the payment's result.
type Output struct {
	PaymentID string `json:"payment_id"`
	ChargeID  string `json:"charge_id"`
	Status    string `json:"status"`
}

// Config configures New.
type Config struct {
	// Pool is the database of the payments tables (see Setup).
	Pool *pgxpool.Pool
	// GatewayURL is the payment gateway's base URL. Required.
	GatewayURL string
	// MailURL is the mail service's base URL. Required.
	MailURL string
	// HTTP sends gateway and mail requests. Defaults to steps.NewClient(nil),
	// which sends child keys and trace context.
	HTTP *http.Client
	// CustomerLimit is how many of one customer's payments run at once;
	// the rest are created and queue in arrival order (blocked reason
	// concurrency). 0 takes DefaultCustomerLimit; negative is an error.
	CustomerLimit int
}

// DefaultCustomerLimit is the per-customer limit a zero Config gets: high
// enough that no real customer waits, low enough that a script hammering
// one customer cannot take every executor.
const DefaultCustomerLimit = 10

// Payments holds the workflow's dependencies.
type Payments struct {
	cfg    Config
	outbox *river.Client[pgx.Tx]
}

// New returns the payments example. It does no I/O.
func New(cfg Config) (*Payments, error) {
	if cfg.Pool == nil || cfg.GatewayURL == "" || cfg.MailURL == "" {
		return nil, errors.New("payments: Pool, GatewayURL and MailURL are required")
	}
	if cfg.CustomerLimit < 0 {
		return nil, fmt.Errorf("payments: CustomerLimit %d: want 0 (the default, %d) or more", cfg.CustomerLimit, DefaultCustomerLimit)
	}
	if cfg.CustomerLimit == 0 {
		cfg.CustomerLimit = DefaultCustomerLimit
	}
	if cfg.HTTP == nil {
		cfg.HTTP = steps.NewClient(nil)
	}
	// An insert-only River client: the outbox is written with InsertTx in
	// the phase's transaction, and worked by the process's worker.
	outbox, err := river.NewClient(riverpgxv5.New(nil), &river.Config{Schema: migrations.Schema})
	if err != nil {
		return nil, fmt.Errorf("payments: outbox client: %w", err)
	}
	return &Payments{cfg: cfg, outbox: outbox}, nil
}

// Register adds the payment workflow: kept forever (it moves money), 201 on
// success, 402 for a declined card, 400 for an invalid payment, 409 for a
// payment refused by the ledger (and refunded); at most CustomerLimit of a
// customer's payments run at once.
func (p *Payments) Register(workflows *engine.Workflows) (*engine.Workflow[Input, Output], error) {
	return engine.Register(workflows, WorkflowName, p.pay, &engine.WorkflowOpts{
		Retention:     engine.RetentionForever,
		SuccessStatus: http.StatusCreated,
		ErrorStatuses: map[string]int{"card_declined": http.StatusPaymentRequired, "invalid_payment": http.StatusBadRequest, CodeAccountClosed: http.StatusConflict},
		Concurrency:   &engine.Concurrency{Key: "customer", Limit: p.cfg.CustomerLimit},
	})
}

var currencyRE = regexp.MustCompile(`^[a-z]{3}$`)

func (in Input) validate() error {
	var problems []string
	if in.Amount <= 0 {
		problems = append(problems, "amount must be a positive number of minor units")
	}
	if !currencyRE.MatchString(in.Currency) {
		problems = append(problems, "currency must be three lowercase letters")
	}
	if in.Customer == "" {
		problems = append(problems, "customer is required")
	}
	if _, err := mail.ParseAddress(in.Email); err != nil {
		problems = append(problems, "email must be an address")
	}
	if len(problems) > 0 {
		return steps.Permanent("invalid_payment", errors.New(strings.Join(problems, "; ")))
	}
	return nil
}

func (p *Payments) pay(ctx context.Context, in Input) (Output, error) {
	if err := in.validate(); err != nil {
		return Output{}, err
	}
	paymentID, err := engine.Atomic(ctx, "payment_created", func(ctx context.Context, tx pgx.Tx) (string, error) {
		id := "pay_" + strings.ToLower(ulid.Make().String())
		_, err := tx.Exec(ctx, `
			INSERT INTO payments.payments (id, amount, currency, customer, email, status)
			VALUES ($1, $2, $3, $4, $5, 'pending')`, id, in.Amount, in.Currency, in.Customer, in.Email)
		return id, err
	}, nil)
	if err != nil {
		return Output{}, err
	}

	charge, err := engine.Step(ctx, "charge_created", func(ctx context.Context, _ steps.Key) (charge, error) {
		return p.charge(ctx, in)
	}, &engine.StepOpts[charge]{
		Compensate: func(ctx context.Context, _ steps.Key, ch charge) error { return p.refund(ctx, ch.ID) },
		Reconcile:  p.findCharge,
		KeyWindow:  GatewayKeyWindow,
	})
	if err != nil {
		var perm *steps.PermanentError
		if errors.As(err, &perm) {
			// Record the decline, then fail the run with it.
			if _, ferr := engine.Atomic(ctx, "payment_declined", func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
				_, err := tx.Exec(ctx, `UPDATE payments.payments SET status = 'declined', updated_at = now() WHERE id = $1`, paymentID)
				return struct{}{}, err
			}, nil); ferr != nil {
				return Output{}, ferr
			}
		}
		return Output{}, err
	}

	_, err = engine.Atomic(ctx, "ledger_posted", func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
		var closed bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM payments.closed_accounts WHERE customer = $1)`, in.Customer).Scan(&closed); err != nil {
			return struct{}{}, err
		}
		if closed {
			return struct{}{}, steps.Permanent(CodeAccountClosed, fmt.Errorf("the ledger account of %s is closed", in.Customer))
		}
		// Double entry: the customer's account is debited what revenue is
		// credited; every payment's entries sum to zero.
		if _, err := tx.Exec(ctx, `
			INSERT INTO payments.ledger_entries (payment_id, account, amount, currency)
			VALUES ($1, 'customer:' || $2, -$3::bigint, $4), ($1, 'revenue', $3::bigint, $4)`,
			paymentID, in.Customer, in.Amount, in.Currency); err != nil {
			return struct{}{}, err
		}
		if _, err := tx.Exec(ctx, `
			UPDATE payments.payments SET status = 'succeeded', charge_id = $2, updated_at = now() WHERE id = $1`,
			paymentID, charge.ID); err != nil {
			return struct{}{}, err
		}
		// The outbox: the receipt is staged iff this phase commits.
		_, err := p.outbox.InsertTx(ctx, tx, ReceiptArgs{
			PaymentID: paymentID, Email: in.Email, ChargeID: charge.ID, Amount: in.Amount, Currency: in.Currency,
		}, &river.InsertOpts{Queue: QueueReceipts})
		return struct{}{}, err
	}, &engine.AtomicOpts[struct{}]{Pivot: true})
	var perm *steps.PermanentError
	if errors.As(err, &perm) {
		// Record the refusal, then fail the run with it: the engine
		// refunds the charge (its undo) before the run finishes.
		if _, ferr := engine.Atomic(ctx, "payment_refused", func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			_, err := tx.Exec(ctx, `UPDATE payments.payments SET status = 'refused', charge_id = $2, updated_at = now() WHERE id = $1`, paymentID, charge.ID)
			return struct{}{}, err
		}, nil); ferr != nil {
			return Output{}, ferr
		}
	}
	if err != nil {
		return Output{}, err
	}
	return Output{PaymentID: paymentID, ChargeID: charge.ID, Status: "succeeded"}, nil
}

// Setup creates the example's tables if they do not exist.
func Setup(ctx context.Context, pool *pgxpool.Pool) error {
	// One message, so one transaction, under a lock: replicas starting
	// together would otherwise race to create the schema (IF NOT EXISTS
	// does not make concurrent creations safe).
	_, err := pool.Exec(ctx, `
		SELECT pg_advisory_xact_lock(hashtext('payments.setup'));
		CREATE SCHEMA IF NOT EXISTS payments;
		CREATE TABLE IF NOT EXISTS payments.payments (
			id         text        PRIMARY KEY,
			amount     bigint      NOT NULL CHECK (amount > 0),
			currency   text        NOT NULL,
			customer   text        NOT NULL,
			email      text        NOT NULL,
			status     text        NOT NULL,
			charge_id  text,
			created_at timestamptz NOT NULL DEFAULT now(),
			updated_at timestamptz NOT NULL DEFAULT now()
		);
		CREATE TABLE IF NOT EXISTS payments.ledger_entries (
			id         bigserial   PRIMARY KEY,
			payment_id text        NOT NULL REFERENCES payments.payments,
			account    text        NOT NULL,
			amount     bigint      NOT NULL,
			currency   text        NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now()
		);
		ALTER TABLE payments.payments DROP CONSTRAINT IF EXISTS payments_status_check;
		ALTER TABLE payments.payments ADD CONSTRAINT payments_status_check
			CHECK (status IN ('pending', 'succeeded', 'declined', 'refused'));
		-- Customers whose ledger account is closed: the ledger refuses their
		-- payments, and the charge is refunded.
		CREATE TABLE IF NOT EXISTS payments.closed_accounts (
			customer text PRIMARY KEY
		);
		CREATE TABLE IF NOT EXISTS payments.receipts (
			payment_id   text        PRIMARY KEY REFERENCES payments.payments,
			message_id   text        NOT NULL,
			delivered_at timestamptz NOT NULL DEFAULT now()
		)`)
	if err != nil {
		return fmt.Errorf("payments: create tables: %w", err)
	}
	return nil
}
