package fakes

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
)

// Message is what the fake mail service accepts at POST /v1/messages.
type Message struct {
	// MessageID is the sender's stable id for the message. The service
	// records it but deduplicates nothing: it delivers every request.
	MessageID string `json:"message_id"`
	To        string `json:"to"`
	Subject   string `json:"subject"`
	Body      string `json:"body"`
}

// MailStats is what GET /stats reports.
type MailStats struct {
	Deliveries            int            `json:"deliveries"`
	DeliveriesByMessageID map[string]int `json:"deliveries_by_message_id"`
	DeliveriesByRecipient map[string]int `json:"deliveries_by_recipient"`
}

// Mail is a fake mail service that has never heard of idempotency: every
// request is a delivery. It is safe for concurrent use.
type Mail struct {
	mux *http.ServeMux

	mu        sync.Mutex
	stats     MailStats
	delivered []Message
	// AfterDelivery, if set, is called after a delivery is counted and
	// before the answer is written.
	afterDelivery func(Message)
}

// MailOpts configure NewMail. A nil *MailOpts is valid.
type MailOpts struct {
	AfterDelivery func(Message)
}

// NewMail returns a mail service with no deliveries.
func NewMail(opts *MailOpts) *Mail {
	m := &Mail{mux: http.NewServeMux(), stats: MailStats{DeliveriesByMessageID: map[string]int{}, DeliveriesByRecipient: map[string]int{}}}
	if opts != nil {
		m.afterDelivery = opts.AfterDelivery
	}
	m.mux.HandleFunc("POST /v1/messages", m.deliver)
	m.mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, m.Stats()) })
	return m
}

func (m *Mail) ServeHTTP(w http.ResponseWriter, r *http.Request) { m.mux.ServeHTTP(w, r) }

// Stats returns a copy of the counters.
func (m *Mail) Stats() MailStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	s.DeliveriesByMessageID, s.DeliveriesByRecipient = clone(s.DeliveriesByMessageID), clone(s.DeliveriesByRecipient)
	return s
}

// Delivered returns every message delivered, in order.
func (m *Mail) Delivered() []Message {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Message(nil), m.delivered...)
}

func (m *Mail) deliver(w http.ResponseWriter, r *http.Request) {
	var msg Message
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&msg); err != nil || msg.To == "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "want JSON {message_id, to, subject, body}")
		return
	}
	m.mu.Lock()
	m.stats.Deliveries++
	n := m.stats.Deliveries
	if msg.MessageID != "" {
		m.stats.DeliveriesByMessageID[msg.MessageID]++
	}
	m.stats.DeliveriesByRecipient[msg.To]++
	m.delivered = append(m.delivered, msg)
	m.mu.Unlock()
	if m.afterDelivery != nil {
		m.afterDelivery(msg)
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"id": fmt.Sprintf("msg_%06d", n)})
}
