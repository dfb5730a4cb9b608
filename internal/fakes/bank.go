package fakes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// Webhooks say how the fake bank reports a settled transfer: Delay after
// the transfer is created; Twice sends the webhook twice (same event id),
// as providers do; Early sends it before the transfer request is
// answered, so it reaches the payer before the payer awaits it; Drop
// never sends it.
type Webhooks struct {
	Delay time.Duration
	Twice bool
	Early bool
	Drop  bool
}

// BankOpts configure NewBank.
type BankOpts struct {
	// WebhookURL receives the settlement webhooks:
	// POST WebhookURL?correlation_key=<transfer id>, Idempotency-Key: the
	// event id, body {"transfer_id", "status"}.
	WebhookURL string
	// Webhooks applies to every transfer; a request may choose its own
	// with the header "Fake-Webhook: early", "twice", "drop" or
	// "delay=250ms" (comma separated).
	Webhooks Webhooks
	// Client sends the webhooks. Defaults to http.DefaultClient.
	Client *http.Client
}

// TransferRequest is the body of POST /v1/transfers.
type TransferRequest struct {
	Amount  int64  `json:"amount"`
	Account string `json:"account"`
}

// Transfer is a transfer the bank accepted.
type Transfer struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	Status string `json:"status"`
}

// BankStats counts what the bank did.
type BankStats struct {
	// TransfersByKey counts transfers created per idempotency key (a
	// replayed request creates none).
	TransfersByKey map[string]int
	// WebhooksSent counts webhook deliveries the receiver accepted (2xx).
	WebhooksSent int
}

// Bank is a fake bank: POST /v1/transfers creates a transfer, idempotent
// by Idempotency-Key, and reports its settlement by webhook later.
type Bank struct {
	opts  BankOpts
	mu    sync.Mutex
	byKey map[string]Transfer
	stats BankStats
	wg    sync.WaitGroup
}

// NewBank returns a fake bank.
func NewBank(opts BankOpts) *Bank {
	if opts.Client == nil {
		opts.Client = http.DefaultClient
	}
	return &Bank{opts: opts, byKey: map[string]Transfer{}, stats: BankStats{TransfersByKey: map[string]int{}}}
}

// Wait waits for the webhooks scheduled so far to be sent.
func (b *Bank) Wait() { b.wg.Wait() }

// Stats returns a copy of the counts.
func (b *Bank) Stats() BankStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := BankStats{TransfersByKey: make(map[string]int, len(b.stats.TransfersByKey)), WebhooksSent: b.stats.WebhooksSent}
	for k, n := range b.stats.TransfersByKey {
		s.TransfersByKey[k] = n
	}
	return s
}

func (b *Bank) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/transfers" {
		http.NotFound(w, r)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	var req TransferRequest
	if key == "" || json.NewDecoder(r.Body).Decode(&req) != nil || req.Amount <= 0 {
		http.Error(w, "want an Idempotency-Key and a positive amount", http.StatusBadRequest)
		return
	}
	hooks, err := webhooksFor(b.opts.Webhooks, r.Header.Get("Fake-Webhook"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	b.mu.Lock()
	t, seen := b.byKey[key]
	if !seen {
		t = Transfer{ID: fmt.Sprintf("tr_%d", len(b.byKey)+1), Amount: req.Amount, Status: "pending"}
		b.byKey[key] = t
		b.stats.TransfersByKey[key]++
	}
	b.mu.Unlock()
	if !seen && !hooks.Drop {
		if hooks.Early {
			b.sendWebhooks(t, hooks) // before the payer hears of the transfer
		} else {
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				time.Sleep(hooks.Delay)
				b.sendWebhooks(t, hooks)
			}()
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(t) //nolint:errcheck // the client may be gone
}

func (b *Bank) sendWebhooks(t Transfer, hooks Webhooks) {
	n := 1
	if hooks.Twice {
		n = 2
	}
	body, _ := json.Marshal(map[string]string{"transfer_id": t.ID, "status": "settled"})
	for range n {
		req, err := http.NewRequest(http.MethodPost, b.opts.WebhookURL+"?correlation_key="+t.ID, bytes.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "evt_"+t.ID)
		resp, err := b.opts.Client.Do(req)
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			b.mu.Lock()
			b.stats.WebhooksSent++
			b.mu.Unlock()
		}
	}
}

func webhooksFor(base Webhooks, header string) (Webhooks, error) {
	if header == "" {
		return base, nil
	}
	for _, part := range bytes.Split([]byte(header), []byte(",")) {
		switch p := string(bytes.TrimSpace(part)); {
		case p == "early":
			base.Early = true
		case p == "twice":
			base.Twice = true
		case p == "drop":
			base.Drop = true
		case len(p) > 6 && p[:6] == "delay=":
			d, err := time.ParseDuration(p[6:])
			if err != nil {
				return base, fmt.Errorf("Fake-Webhook: %v", err)
			}
			base.Delay = d
		default:
			return base, fmt.Errorf("Fake-Webhook: unknown %q", p)
		}
	}
	return base, nil
}
