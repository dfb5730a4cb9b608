package fakes

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// DeclinedCustomer is the customer whose card the gateway always declines.
const DeclinedCustomer = "cus_declined"

// Faults are failures injected for every idempotency key: the first
// FailBefore requests for a key answer 500 without charging; the DropAfter
// requests after those are processed (charged, or replayed) and then the
// connection is closed with no answer; every answer waits Latency first.
//
// A single request can ask for a fault with the header
// "Fake-Fault: fail-before", "drop-after" or "latency=250ms" (comma
// separated to combine).
type Faults struct {
	FailBefore int           `json:"fail_before"`
	DropAfter  int           `json:"drop_after"`
	Latency    time.Duration `json:"latency"`
	// RefuseRefunds answers every refund 400 charge_disputed (a
	// permanent refusal) without refunding.
	RefuseRefunds bool `json:"refuse_refunds"`
	// RefundsDown answers every refund 503 (a passing outage).
	RefundsDown bool `json:"refunds_down"`
}

// GatewayOpts configure NewGateway. A nil *GatewayOpts is valid.
type GatewayOpts struct {
	Faults Faults
	// AfterCharge, if set, is called once a new charge is performed and its
	// response stored, before the response is written: the moment a crash
	// test kills the caller.
	AfterCharge func(key string)
	// AfterRefund is AfterCharge for refunds.
	AfterRefund func(key string)
	// KeyWindow is how long the gateway remembers an idempotency key,
	// from its first use; a request with a key older than that is a new
	// request (a second charge), as with any real gateway's finite
	// retention. Charges keep their key, so GET /v1/charges?idempotency_key=
	// still finds them. Zero remembers keys for ever.
	KeyWindow time.Duration
}

// RefundRequest is the body of POST /v1/refunds.
type RefundRequest struct {
	Charge string `json:"charge"`
}

// Refund is a refund the gateway performed.
type Refund struct {
	ID             string `json:"id"`
	Charge         string `json:"charge"`
	Amount         int64  `json:"amount"`
	Status         string `json:"status"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// ChargeRequest is the body of POST /v1/charges.
type ChargeRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Customer string `json:"customer"`
}

// Charge is a charge the gateway performed.
type Charge struct {
	ID             string `json:"id"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	Customer       string `json:"customer"`
	Status         string `json:"status"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// Request is what the gateway records of each charge request's headers.
type Request struct {
	IdempotencyKey string `json:"idempotency_key"`
	Traceparent    string `json:"traceparent"`
}

// Stats is what GET /stats reports.
type Stats struct {
	// Charges counts charges performed; a replay or a decline is not one.
	Charges        int            `json:"charges"`
	ChargesByKey   map[string]int `json:"charges_by_key"`
	RequestsByKey  map[string]int `json:"requests_by_key"`
	DeclinesByKey  map[string]int `json:"declines_by_key"`
	RequestsNoKeys int            `json:"requests_without_key"`
	// Refunds counts refunds performed; RefundsByCharge and RefundsByKey
	// count them per charge and per idempotency key.
	Refunds         int            `json:"refunds"`
	RefundsByCharge map[string]int `json:"refunds_by_charge"`
	RefundsByKey    map[string]int `json:"refunds_by_key"`
	// ReconcileQueries counts GET /v1/charges?idempotency_key= requests.
	ReconcileQueries int `json:"reconcile_queries"`
	// MaxInFlightByCustomer is the most charges of one customer the
	// gateway was processing at once (a Latency fault makes them last):
	// what a per-customer concurrency limit upstream must bound.
	MaxInFlightByCustomer map[string]int `json:"max_in_flight_by_customer"`
}

// Gateway is a fake payment gateway. It is safe for concurrent use.
type Gateway struct {
	mux         *http.ServeMux
	afterCharge func(string)
	afterRefund func(string)
	keyWindow   time.Duration

	mu       sync.Mutex
	faults   Faults
	byKey    map[string]*stored
	charges  []Charge
	refunds  map[string]Refund // by idempotency key
	requests []Request
	inFlight map[string]int // charges being processed, by customer
	stats    Stats
}

// stored is the idempotency record of one key.
type stored struct {
	at       time.Time // first use, for KeyWindow
	params   ChargeRequest
	inFlight bool
	status   int
	body     []byte
	charge   *Charge
}

// NewGateway returns a gateway with no charges.
func NewGateway(opts *GatewayOpts) *Gateway {
	if opts == nil {
		opts = &GatewayOpts{}
	}
	g := &Gateway{
		mux: http.NewServeMux(), afterCharge: opts.AfterCharge, afterRefund: opts.AfterRefund, keyWindow: opts.KeyWindow, faults: opts.Faults,
		byKey: map[string]*stored{}, refunds: map[string]Refund{}, inFlight: map[string]int{},
		stats: Stats{ChargesByKey: map[string]int{}, RequestsByKey: map[string]int{}, DeclinesByKey: map[string]int{},
			RefundsByCharge: map[string]int{}, RefundsByKey: map[string]int{}, MaxInFlightByCustomer: map[string]int{}},
	}
	g.mux.HandleFunc("POST /v1/charges", g.createCharge)
	g.mux.HandleFunc("POST /v1/refunds", g.createRefund)
	g.mux.HandleFunc("GET /v1/charges", g.findCharge)
	g.mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, g.Stats()) })
	g.mux.HandleFunc("PUT /faults", g.putFaults)
	return g
}

func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.mux.ServeHTTP(w, r) }

// SetFaults replaces the injected faults (as PUT /faults does).
func (g *Gateway) SetFaults(f Faults) {
	g.mu.Lock()
	g.faults = f
	g.mu.Unlock()
}

// Stats returns a copy of the counters.
func (g *Gateway) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.stats
	s.ChargesByKey, s.RequestsByKey, s.DeclinesByKey = clone(s.ChargesByKey), clone(s.RequestsByKey), clone(s.DeclinesByKey)
	s.RefundsByCharge, s.RefundsByKey = clone(s.RefundsByCharge), clone(s.RefundsByKey)
	s.MaxInFlightByCustomer = clone(s.MaxInFlightByCustomer)
	return s
}

// Charges returns the charges performed, in order.
func (g *Gateway) Charges() []Charge {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Charge(nil), g.charges...)
}

// Requests returns the recorded headers of every charge request, in order.
func (g *Gateway) Requests() []Request {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Request(nil), g.requests...)
}

func clone(m map[string]int) map[string]int {
	c := make(map[string]int, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func (g *Gateway) createCharge(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var params ChargeRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	decodeErr := dec.Decode(&params)

	g.mu.Lock()
	g.requests = append(g.requests, Request{IdempotencyKey: key, Traceparent: r.Header.Get("Traceparent")})
	attempt := 0
	if key == "" {
		g.stats.RequestsNoKeys++
	} else {
		g.stats.RequestsByKey[key]++
		attempt = g.stats.RequestsByKey[key]
	}
	faults := g.faults
	g.mu.Unlock()
	failBefore, dropAfter, latency := faults.forAttempt(attempt, r.Header.Get("Fake-Fault"))

	// Validation failures and failures before execution store nothing, as
	// with Stripe: a retry with the same key may then succeed.
	if decodeErr != nil || params.Amount <= 0 || params.Currency == "" || params.Customer == "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "amount (positive), currency and customer are required")
		return
	}
	if failBefore {
		writeError(w, http.StatusInternalServerError, "api_error", "", "injected failure before charging")
		return
	}

	status, body, replayed, rec := g.begin(key, params)
	if rec != nil {
		// Processing takes latency; the charge completes even if the
		// client gives up meanwhile, as a real gateway's would.
		g.processing(params.Customer, 1)
		time.Sleep(latency)
		var charged bool
		status, body, charged = g.complete(key, params, rec)
		g.processing(params.Customer, -1)
		if charged && g.afterCharge != nil {
			g.afterCharge(key)
		}
	}
	if dropAfter {
		drop(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // the client may be gone
}

// begin looks the key up. It returns a stored or conflicting answer, or a
// new in-flight record (rec != nil) for the caller to complete.
func (g *Gateway) begin(key string, params ChargeRequest) (status int, body []byte, replayed bool, rec *stored) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if key == "" {
		return 0, nil, false, &stored{params: params}
	}
	prev, ok := g.byKey[key]
	if ok && g.keyWindow > 0 && !prev.inFlight && time.Since(prev.at) >= g.keyWindow {
		ok = false // forgotten: the request is a new one
	}
	switch {
	case !ok:
		rec = &stored{at: time.Now(), params: params, inFlight: true}
		g.byKey[key] = rec
		return 0, nil, false, rec
	case prev.params != params:
		status, body = errorBody(http.StatusBadRequest, "idempotency_error", "",
			"Keys for idempotent requests can only be used with the same parameters they were first used with.")
		return status, body, false, nil
	case prev.inFlight:
		status, body = errorBody(http.StatusConflict, "idempotency_error", "idempotency_key_in_use",
			"There is currently another in-progress request using this Idempotent Key.")
		return status, body, false, nil
	}
	return prev.status, prev.body, true, nil
}

// processing counts a customer's charge in (delta 1) or out (-1) of
// processing, keeping the customer's most at once.
func (g *Gateway) processing(customer string, delta int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inFlight[customer] += delta
	if n := g.inFlight[customer]; n > g.stats.MaxInFlightByCustomer[customer] {
		g.stats.MaxInFlightByCustomer[customer] = n
	}
}

// complete performs the charge (or the decline) and stores the answer.
func (g *Gateway) complete(key string, params ChargeRequest, rec *stored) (status int, body []byte, charged bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if params.Customer == DeclinedCustomer {
		status, body = errorBody(http.StatusPaymentRequired, "card_error", "card_declined", "Your card was declined.")
		if key != "" {
			g.stats.DeclinesByKey[key]++
		}
	} else {
		ch := Charge{ID: fmt.Sprintf("ch_%06d", len(g.charges)+1), Amount: params.Amount, Currency: params.Currency,
			Customer: params.Customer, Status: "succeeded", IdempotencyKey: key}
		g.charges = append(g.charges, ch)
		g.stats.Charges++
		if key != "" {
			g.stats.ChargesByKey[key]++
		}
		body, _ = json.Marshal(ch)
		status, charged = http.StatusOK, true
		rec.charge = &ch
	}
	rec.status, rec.body, rec.inFlight = status, body, false
	return status, body, charged
}

// findCharge answers GET /v1/charges?idempotency_key=K, for reconciliation.
func (g *Gateway) findCharge(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("idempotency_key")
	if key == "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "idempotency_key is required")
		return
	}
	g.mu.Lock()
	g.stats.ReconcileQueries++
	var ch *Charge
	for i := range g.charges { // the charge keeps its key after the key is forgotten
		if g.charges[i].IdempotencyKey == key {
			ch = &g.charges[i]
			break
		}
	}
	g.mu.Unlock()
	if ch == nil {
		writeError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "no charge was made with this idempotency key")
		return
	}
	writeJSON(w, http.StatusOK, ch)
}

// createRefund refunds a charge in full, deduplicated on Idempotency-Key
// (required: a refund is money).
func (g *Gateway) createRefund(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var params RefundRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&params); err != nil || params.Charge == "" || key == "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "charge and an Idempotency-Key are required")
		return
	}
	g.mu.Lock()
	faults := g.faults
	if faults.RefundsDown {
		g.mu.Unlock()
		writeError(w, http.StatusServiceUnavailable, "api_error", "", "refunds are unavailable")
		return
	}
	if faults.RefuseRefunds {
		g.mu.Unlock()
		writeError(w, http.StatusBadRequest, "invalid_request_error", "charge_disputed", "The charge is disputed and cannot be refunded.")
		return
	}
	if rf, ok := g.refunds[key]; ok {
		g.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		writeJSON(w, http.StatusOK, rf)
		return
	}
	var charge *Charge
	for i := range g.charges {
		if g.charges[i].ID == params.Charge {
			charge = &g.charges[i]
		}
	}
	if charge == nil {
		g.mu.Unlock()
		writeError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "no such charge")
		return
	}
	rf := Refund{ID: fmt.Sprintf("re_%06d", g.stats.Refunds+1), Charge: charge.ID, Amount: charge.Amount, Status: "succeeded", IdempotencyKey: key}
	g.refunds[key] = rf
	g.stats.Refunds++
	g.stats.RefundsByCharge[charge.ID]++
	g.stats.RefundsByKey[key]++
	g.mu.Unlock()
	if g.afterRefund != nil {
		g.afterRefund(key)
	}
	writeJSON(w, http.StatusOK, rf)
}

func (g *Gateway) putFaults(w http.ResponseWriter, r *http.Request) {
	var f struct {
		FailBefore    int    `json:"fail_before"`
		DropAfter     int    `json:"drop_after"`
		Latency       string `json:"latency"`
		RefuseRefunds bool   `json:"refuse_refunds"`
		RefundsDown   bool   `json:"refunds_down"`
	}
	if err := json.NewDecoder(r.Body).Decode(&f); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "want {fail_before, drop_after, latency}: "+err.Error())
		return
	}
	var latency time.Duration
	if f.Latency != "" {
		var err error
		if latency, err = time.ParseDuration(f.Latency); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "", "latency: "+err.Error())
			return
		}
	}
	g.SetFaults(Faults{FailBefore: f.FailBefore, DropAfter: f.DropAfter, Latency: latency, RefuseRefunds: f.RefuseRefunds, RefundsDown: f.RefundsDown})
	w.WriteHeader(http.StatusNoContent)
}

// forAttempt decides the faults of the attempt-th request for a key (0 when
// the request has none) from the configured faults and the request's
// Fake-Fault header.
func (f Faults) forAttempt(attempt int, header string) (failBefore, dropAfter bool, latency time.Duration) {
	if attempt > 0 {
		failBefore = attempt <= f.FailBefore
		dropAfter = !failBefore && attempt <= f.FailBefore+f.DropAfter
	}
	latency = f.Latency
	for _, part := range strings.Split(header, ",") {
		switch part = strings.TrimSpace(part); {
		case part == "fail-before":
			failBefore = true
		case part == "drop-after":
			dropAfter = true
		case strings.HasPrefix(part, "latency="):
			if d, err := time.ParseDuration(strings.TrimPrefix(part, "latency=")); err == nil {
				latency = d
			}
		}
	}
	return failBefore, dropAfter, latency
}

// drop closes the connection without an answer: the client sees its
// request sent and no response.
func drop(w http.ResponseWriter) {
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		conn.Close()
		return
	}
	panic(http.ErrAbortHandler) // HTTP/2: abort the stream instead
}

func errorBody(status int, typ, code, message string) (int, []byte) {
	e := map[string]string{"type": typ, "message": message}
	if code != "" {
		e["code"] = code
	}
	body, _ := json.Marshal(map[string]any{"error": e})
	return status, body
}

func writeError(w http.ResponseWriter, status int, typ, code, message string) {
	status, body := errorBody(status, typ, code, message)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v) //nolint:errcheck
}
