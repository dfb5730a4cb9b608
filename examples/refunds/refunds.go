// Package refunds is a refund workflow written against the public packages
// only, as an adopter would, and tested with the public test kit
// (engine/enginetest) alone:
//
//  1. payment_looked_up (atomic): the captured payment, locked, and how
//     much of it is left to refund; too much is a permanent failure.
//  2. refund_created (step): the gateway's refund, sent with the step's
//     child idempotency key, so a retried or resumed call is the same
//     refund downstream.
//  3. refund_recorded (atomic): the ledger reversal (two entries summing to
//     zero), the payment's refunded total, the refund row and the
//     customer's notification — staged through the outbox, a River job
//     inserted in the same transaction — commit together or not at all.
package refunds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/migrations"
	"github.com/ratchet-run/ratchet/steps"
)

// WorkflowName is the name the refund workflow is registered under.
const WorkflowName = "refund"

// QueueNotices is the River queue of refund notifications.
const QueueNotices = "refund_notices"

// Input asks to refund part or all of a captured payment.
type Input struct {
	PaymentID string `json:"payment_id"`
	Amount    int64  `json:"amount"`
	Reason    string `json:"reason"`
}

// Output is the recorded refund.
type Output struct {
	RefundID string `json:"refund_id"`
	// Remaining is what is left to refund of the payment.
	Remaining int64 `json:"remaining"`
}

// Config configures New.
type Config struct {
	// GatewayURL is the payment gateway's base URL (POST /v1/refunds).
	GatewayURL string
	// NotifyURL is the notification service's base URL (POST /v1/notices).
	NotifyURL string
	// HTTP sends gateway and notification requests. Defaults to
	// steps.NewClient(nil), which sends child keys and trace context.
	HTTP *http.Client
}

// Refunds holds the workflow's dependencies.
type Refunds struct {
	cfg    Config
	outbox *river.Client[pgx.Tx]
}

// New returns the refund example. It does no I/O.
func New(cfg Config) (*Refunds, error) {
	if cfg.GatewayURL == "" || cfg.NotifyURL == "" {
		return nil, errors.New("refunds: GatewayURL and NotifyURL are required")
	}
	if cfg.HTTP == nil {
		cfg.HTTP = steps.NewClient(nil)
	}
	// An insert-only River client for the outbox (a worker's River() would
	// do as well): jobs are inserted with the phase's transaction, in
	// Ratchet's schema, and worked by the process's worker.
	outbox, err := river.NewClient(riverpgxv5.New(nil), &river.Config{Schema: migrations.Schema})
	if err != nil {
		return nil, fmt.Errorf("refunds: outbox client: %w", err)
	}
	return &Refunds{cfg: cfg, outbox: outbox}, nil
}

// Register adds the refund workflow: kept 120 days (a chargeback window),
// a refused refund for a day; 201 on success, 409 when the payment has
// too little left, 404 for an unknown payment.
func (r *Refunds) Register(workflows *engine.Workflows) (*engine.Workflow[Input, Output], error) {
	return engine.Register(workflows, WorkflowName, r.refund, &engine.WorkflowOpts{
		Retention:       120 * 24 * time.Hour,
		FailedRetention: engine.Retention24h,
		ErrorStatuses:   map[string]int{"not_refundable": http.StatusConflict, "unknown_payment": http.StatusNotFound, "invalid_refund": http.StatusBadRequest},
		// The gateway may be down for a while; after a day an operator
		// should look (the run fails with retries_exhausted).
		Retry: &engine.RetryPolicy{MaxElapsed: 24 * time.Hour},
	})
}

type payment struct {
	ChargeID  string `json:"charge_id"`
	Customer  string `json:"customer"`
	Currency  string `json:"currency"`
	Remaining int64  `json:"remaining"` // before this refund
}

func (r *Refunds) refund(ctx context.Context, in Input) (Output, error) {
	if in.Amount <= 0 || in.PaymentID == "" {
		return Output{}, steps.Permanent("invalid_refund", errors.New("payment_id and a positive amount are required"))
	}
	p, err := engine.Atomic(ctx, "payment_looked_up", func(ctx context.Context, tx pgx.Tx) (payment, error) {
		var p payment
		err := tx.QueryRow(ctx, `
			SELECT charge_id, customer, currency, amount - refunded FROM refunds.payments
			WHERE id = $1 FOR UPDATE`, in.PaymentID).Scan(&p.ChargeID, &p.Customer, &p.Currency, &p.Remaining)
		if errors.Is(err, pgx.ErrNoRows) {
			return p, steps.Permanent("unknown_payment", fmt.Errorf("no payment %q", in.PaymentID))
		}
		if err == nil && in.Amount > p.Remaining {
			err = steps.Permanent("not_refundable", fmt.Errorf("%d left to refund of payment %s, asked %d", p.Remaining, in.PaymentID, in.Amount))
		}
		return p, err
	}, nil)
	if err != nil {
		return Output{}, err
	}

	refundID, err := engine.Step(ctx, "refund_created", func(ctx context.Context, _ steps.Key) (string, error) {
		return r.createRefund(ctx, p.ChargeID, in.Amount)
	}, nil)
	if err != nil {
		return Output{}, err
	}

	remaining, err := engine.Atomic(ctx, "refund_recorded", func(ctx context.Context, tx pgx.Tx) (int64, error) {
		// The reversal of the payment's entries, for the refunded amount.
		if _, err := tx.Exec(ctx, `
			INSERT INTO refunds.ledger_entries (payment_id, refund_id, account, amount, currency)
			VALUES ($1, $2, 'customer:' || $3, $4::bigint, $5), ($1, $2, 'revenue', -$4::bigint, $5)`,
			in.PaymentID, refundID, p.Customer, in.Amount, p.Currency); err != nil {
			return 0, err
		}
		var remaining int64
		if err := tx.QueryRow(ctx, `
			UPDATE refunds.payments SET refunded = refunded + $2 WHERE id = $1
			RETURNING amount - refunded`, in.PaymentID, in.Amount).Scan(&remaining); err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO refunds.refunds (id, payment_id, amount, reason) VALUES ($1, $2, $3, $4)`,
			refundID, in.PaymentID, in.Amount, in.Reason); err != nil {
			return 0, err
		}
		// The outbox: the notice is staged iff this phase commits.
		_, err := r.outbox.InsertTx(ctx, tx, NoticeArgs{RefundID: refundID, Customer: p.Customer, Amount: in.Amount, Currency: p.Currency},
			&river.InsertOpts{Queue: QueueNotices})
		return remaining, err
	}, nil)
	if err != nil {
		return Output{}, err
	}
	return Output{RefundID: refundID, Remaining: remaining}, nil
}

// createRefund calls POST /v1/refunds. The client's transport sends the
// step's child key as Idempotency-Key.
func (r *Refunds) createRefund(ctx context.Context, chargeID string, amount int64) (string, error) {
	body, _ := json.Marshal(map[string]any{"charge": chargeID, "amount": amount})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.cfg.GatewayURL+"/v1/refunds", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.cfg.HTTP.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if err := steps.CheckResponse(resp); err != nil {
		return "", err
	}
	var out struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.ID == "" {
		return "", fmt.Errorf("refunds: gateway answered %d without a refund id", resp.StatusCode)
	}
	return out.ID, nil
}

// NoticeArgs is the outbox job telling a customer about a refund.
type NoticeArgs struct {
	RefundID string `json:"refund_id"`
	Customer string `json:"customer"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// Kind is the River job kind.
func (NoticeArgs) Kind() string { return "refunds.notice" }

// AddWorkers adds the notice delivery worker to a process's River workers
// (worker.Config.Workers).
func (r *Refunds) AddWorkers(workers *river.Workers) error {
	return river.AddWorkerSafely(workers, &noticeWorker{r: r})
}

type noticeWorker struct {
	river.WorkerDefaults[NoticeArgs]
	r *Refunds
}

func (w *noticeWorker) Timeout(*river.Job[NoticeArgs]) time.Duration { return 10 * time.Second }

// Work sends the notice with the job's id as its idempotency key: a
// redelivery after a crash between sending and recording is the same
// notice to a service that deduplicates.
func (w *noticeWorker) Work(ctx context.Context, job *river.Job[NoticeArgs]) error {
	body, _ := json.Marshal(job.Args)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.r.cfg.NotifyURL+"/v1/notices", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(steps.HeaderIdempotencyKey, "refund-notice-"+strconv.FormatInt(job.ID, 10))
	resp, err := w.r.cfg.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return steps.CheckResponse(resp)
}

// Setup creates the example's tables if they do not exist.
func Setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
		SELECT pg_advisory_xact_lock(hashtext('refunds.setup'));
		CREATE SCHEMA IF NOT EXISTS refunds;
		CREATE TABLE IF NOT EXISTS refunds.payments (
			id        text   PRIMARY KEY,
			charge_id text   NOT NULL,
			customer  text   NOT NULL,
			currency  text   NOT NULL,
			amount    bigint NOT NULL CHECK (amount > 0),
			refunded  bigint NOT NULL DEFAULT 0 CHECK (refunded BETWEEN 0 AND amount)
		);
		CREATE TABLE IF NOT EXISTS refunds.refunds (
			id         text        PRIMARY KEY,
			payment_id text        NOT NULL REFERENCES refunds.payments,
			amount     bigint      NOT NULL,
			reason     text        NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now()
		);
		CREATE TABLE IF NOT EXISTS refunds.ledger_entries (
			id         bigserial PRIMARY KEY,
			payment_id text      NOT NULL,
			refund_id  text      NOT NULL,
			account    text      NOT NULL,
			amount     bigint    NOT NULL,
			currency   text      NOT NULL
		)`)
	return err
}
