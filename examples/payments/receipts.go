package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/riverqueue/river"

	"github.com/ratchet-run/ratchet/steps"
)

// ReceiptArgs is the outbox message: a receipt to email.
type ReceiptArgs struct {
	PaymentID string `json:"payment_id"`
	Email     string `json:"email"`
	ChargeID  string `json:"charge_id"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
}

// Kind is the River job kind of receipts.
func (ReceiptArgs) Kind() string { return "payments.receipt" }

// AddWorkers registers the receipt delivery worker; work it on
// QueueReceipts.
func (p *Payments) AddWorkers(workers *river.Workers) error {
	return river.AddWorkerSafely(workers, &receiptWorker{p: p})
}

// MessageID is the stable message id of the receipt of the charge
// chargeID: the same on every delivery attempt, and for every run of the
// payment that gets the same charge from the gateway (runs of key format
// 3 do, even when a failover lost the first: docs/performance.md).
func MessageID(chargeID string) string { return "receipt-" + chargeID }

type receiptWorker struct {
	river.WorkerDefaults[ReceiptArgs]
	p *Payments
}

// Timeout bounds one delivery attempt. It also sets how soon a delivery
// that died with its process is retried: River rescues a job only once its
// timeout has passed (and the worker's RescueStuckJobsAfter), so a short
// one keeps the worst case under a minute (docs/recovery.md).
func (w *receiptWorker) Timeout(*river.Job[ReceiptArgs]) time.Duration { return 10 * time.Second }

// Work sends the receipt and records the delivery. A crash between the two
// resends it, with the same message id: the mail service in this example
// deduplicates nothing, so that is the one duplicate left (see the package
// comment).
func (w *receiptWorker) Work(ctx context.Context, job *river.Job[ReceiptArgs]) error {
	a := job.Args
	msgID := MessageID(a.ChargeID)
	body, _ := json.Marshal(map[string]string{
		"message_id": msgID,
		"to":         a.Email,
		"subject":    "Your receipt",
		"body":       fmt.Sprintf("We charged %d %s (charge %s) for payment %s.", a.Amount, a.Currency, a.ChargeID, a.PaymentID),
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.p.cfg.MailURL+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.p.cfg.HTTP.Do(req)
	if err != nil {
		return err
	}
	if err := steps.CheckResponse(resp); err != nil {
		return err
	}
	resp.Body.Close()
	_, err = w.p.cfg.Pool.Exec(ctx, `
		INSERT INTO payments.receipts (payment_id, message_id) VALUES ($1, $2)
		ON CONFLICT (payment_id) DO NOTHING`, a.PaymentID, msgID)
	return err
}
