package fakes

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/steps"
)

func post(t *testing.T, url, key string, req ChargeRequest, fault string) (*http.Response, []byte) {
	t.Helper()
	body, _ := json.Marshal(req)
	hreq, err := http.NewRequest(http.MethodPost, url+"/v1/charges", bytes.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		hreq.Header.Set("Idempotency-Key", key)
	}
	if fault != "" {
		hreq.Header.Set("Fake-Fault", fault)
	}
	resp, err := http.DefaultClient.Do(hreq)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

var card = ChargeRequest{Amount: 1299, Currency: "usd", Customer: "cus_123"}

func TestGatewayReplaysSameKeyAndParams(t *testing.T) {
	t.Parallel()
	g := NewGateway(nil)
	srv := httptest.NewServer(g)
	defer srv.Close()

	first, body1 := post(t, srv.URL, "k1", card, "")
	require.Equal(t, http.StatusOK, first.StatusCode)
	second, body2 := post(t, srv.URL, "k1", card, "")
	require.Equal(t, http.StatusOK, second.StatusCode)
	require.Equal(t, body1, body2)
	require.Equal(t, "true", second.Header.Get("Idempotent-Replayed"))
	require.Empty(t, first.Header.Get("Idempotent-Replayed"))

	other := card
	other.Amount = 1
	resp, body := post(t, srv.URL, "k1", other, "")
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Contains(t, string(body), "idempotency_error")

	stats := g.Stats()
	require.Equal(t, 1, stats.Charges)
	require.Equal(t, map[string]int{"k1": 1}, stats.ChargesByKey)
	require.Equal(t, map[string]int{"k1": 3}, stats.RequestsByKey)
}

func TestGatewayAnswersConflictWhileKeyInFlight(t *testing.T) {
	t.Parallel()
	g := NewGateway(nil)
	srv := httptest.NewServer(g)
	defer srv.Close()

	done := make(chan int, 1)
	go func() {
		resp, _ := post(t, srv.URL, "k1", card, "latency=2s")
		done <- resp.StatusCode
	}()
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		rec, ok := g.byKey["k1"]
		return ok && rec.inFlight
	}, 5*time.Second, time.Millisecond)

	resp, body := post(t, srv.URL, "k1", card, "")
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Contains(t, string(body), "idempotency_key_in_use")
	require.Equal(t, http.StatusOK, <-done)
	require.Equal(t, 1, g.Stats().Charges)
}

func TestGatewayStoresAndReplaysDeclines(t *testing.T) {
	t.Parallel()
	g := NewGateway(nil)
	srv := httptest.NewServer(g)
	defer srv.Close()
	declined := ChargeRequest{Amount: 500, Currency: "usd", Customer: DeclinedCustomer}

	resp, body := post(t, srv.URL, "k1", declined, "")
	require.Equal(t, http.StatusPaymentRequired, resp.StatusCode)
	require.Contains(t, string(body), "card_declined")
	again, body2 := post(t, srv.URL, "k1", declined, "")
	require.Equal(t, http.StatusPaymentRequired, again.StatusCode)
	require.Equal(t, body, body2)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Zero(t, g.Stats().Charges)
	require.Equal(t, 1, g.Stats().DeclinesByKey["k1"])
}

func TestGatewayFaults(t *testing.T) {
	t.Parallel()
	g := NewGateway(&GatewayOpts{Faults: Faults{FailBefore: 1, DropAfter: 1}})
	srv := httptest.NewServer(g)
	defer srv.Close()

	resp, _ := post(t, srv.URL, "k1", card, "")
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, "the first request fails before charging")
	require.Zero(t, g.Stats().Charges)

	body, _ := json.Marshal(card)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", bytes.NewReader(body))
	req.Header.Set("Idempotency-Key", "k1")
	// A fresh connection: on a reused one, net/http would itself resend a
	// request carrying Idempotency-Key after the drop.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	_, err := fresh.Do(req)
	require.Error(t, err, "the second request charges, then its answer is dropped")
	require.Equal(t, 1, g.Stats().Charges)

	resp, _ = post(t, srv.URL, "k1", card, "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"), "the third gets the stored charge")
	require.Equal(t, 1, g.Stats().Charges)

	// Faults by header, on a fresh key.
	resp, _ = post(t, srv.URL, "", card, "fail-before")
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
}

func TestGatewayFaultsCanBeSetOverHTTP(t *testing.T) {
	t.Parallel()
	g := NewGateway(nil)
	srv := httptest.NewServer(g)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/faults", bytes.NewReader([]byte(`{"fail_before":2,"latency":"1ms"}`)))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	require.Equal(t, Faults{FailBefore: 2, Latency: time.Millisecond}, g.faults)
}

func TestGatewayReconciliationAndStats(t *testing.T) {
	t.Parallel()
	g := NewGateway(nil)
	srv := httptest.NewServer(g)
	defer srv.Close()
	post(t, srv.URL, "k1", card, "")

	resp, err := http.Get(srv.URL + "/v1/charges?idempotency_key=k1")
	require.NoError(t, err)
	var ch Charge
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ch))
	resp.Body.Close()
	require.Equal(t, Charge{ID: "ch_000001", Amount: 1299, Currency: "usd", Customer: "cus_123", Status: "succeeded", IdempotencyKey: "k1"}, ch)

	resp, err = http.Get(srv.URL + "/v1/charges?idempotency_key=nope")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	resp, err = http.Get(srv.URL + "/stats")
	require.NoError(t, err)
	var stats Stats
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&stats))
	resp.Body.Close()
	require.Equal(t, 1, stats.ChargesByKey["k1"])
}

func TestGatewayCountsEachCustomersChargesInFlight(t *testing.T) {
	t.Parallel()
	g := NewGateway(nil)
	srv := httptest.NewServer(g)
	defer srv.Close()
	a := ChargeRequest{Amount: 1, Currency: "usd", Customer: "cus_a"}
	slow := make(chan error, 1)
	go func() {
		// Not post: a test may only fail from its own goroutine.
		body, _ := json.Marshal(a)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", "a1")
		req.Header.Set("Fake-Fault", "latency=5s")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		slow <- err
	}()
	// a1 is being processed (for 5 s) once it is counted: a2 and a3, one
	// after the other, each overlap it and not each other.
	require.Eventually(t, func() bool { return g.Stats().MaxInFlightByCustomer["cus_a"] == 1 }, 5*time.Second, time.Millisecond)
	post(t, srv.URL, "a2", a, "")
	post(t, srv.URL, "a3", a, "")
	post(t, srv.URL, "b1", ChargeRequest{Amount: 1, Currency: "usd", Customer: "cus_b"}, "")
	require.NoError(t, <-slow)
	require.Equal(t, map[string]int{"cus_a": 2, "cus_b": 1}, g.Stats().MaxInFlightByCustomer)
}

func TestGatewayClientClassifiesAnswers(t *testing.T) {
	t.Parallel()
	g := NewGateway(nil)
	srv := httptest.NewServer(g)
	defer srv.Close()
	c := &GatewayClient{BaseURL: srv.URL, HTTP: steps.NewClient(nil)}
	ctx := steps.WithKey(context.Background(), "rk1_test")

	ch, err := c.Charge(ctx, card)
	require.NoError(t, err)
	require.Equal(t, "rk1_test", ch.IdempotencyKey, "the transport sent the key from the context")

	_, err = c.Charge(steps.WithKey(context.Background(), "rk1_declined"), ChargeRequest{Amount: 1, Currency: "usd", Customer: DeclinedCustomer})
	require.Equal(t, steps.ClassPermanent, steps.Classify(err))

	_, err = c.Charge(ctx, ChargeRequest{Amount: 2, Currency: "usd", Customer: "cus_123"})
	require.Equal(t, steps.ClassPermanent, steps.Classify(err), "same key, other parameters: a 400")

	g.SetFaults(Faults{FailBefore: 1})
	_, err = c.Charge(steps.WithKey(context.Background(), "rk1_fails"), card)
	require.Equal(t, steps.ClassRetryable, steps.Classify(err), "a 500")
}
