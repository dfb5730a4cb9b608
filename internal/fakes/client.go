package fakes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/ratchet-run/ratchet/steps"
)

// GatewayClient calls a Gateway the way a payment step would.
type GatewayClient struct {
	BaseURL string
	// HTTP sends the requests. Use steps.NewClient so that the child key
	// and the trace context are sent.
	HTTP *http.Client
}

// Charge creates a charge. A decline is a steps.PermanentError with code
// "card_declined"; other failures are classified by steps.Classify.
func (c *GatewayClient) Charge(ctx context.Context, req ChargeRequest) (Charge, error) {
	var ch Charge
	body, err := json.Marshal(req)
	if err != nil {
		return ch, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return ch, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	if fault, ok := ctx.Value(faultKey{}).(string); ok {
		hreq.Header.Set("Fake-Fault", fault)
	}
	resp, err := c.HTTP.Do(hreq)
	if err != nil {
		return ch, err
	}
	if err := steps.CheckResponse(resp); err != nil {
		var status *steps.StatusError
		if errors.As(err, &status) && status.StatusCode == http.StatusPaymentRequired {
			return ch, steps.Permanent("card_declined", errors.New("the card was declined"))
		}
		return ch, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&ch); err != nil {
		return ch, fmt.Errorf("decode charge: %w", err)
	}
	return ch, nil
}

type faultKey struct{}

// WithFault returns a context whose gateway requests ask for fault (see
// Faults for the values of the Fake-Fault header).
func WithFault(ctx context.Context, fault string) context.Context {
	return context.WithValue(ctx, faultKey{}, fault)
}

// Refund refunds a charge in full, sending key as its Idempotency-Key. A
// refusal (4xx) is permanent; a 5xx retryable (steps.Classify).
func (c *GatewayClient) Refund(ctx context.Context, key steps.Key, chargeID string) (Refund, error) {
	var rf Refund
	body, err := json.Marshal(RefundRequest{Charge: chargeID})
	if err != nil {
		return rf, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+"/v1/refunds", bytes.NewReader(body))
	if err != nil {
		return rf, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Idempotency-Key", string(key))
	resp, err := c.HTTP.Do(hreq)
	if err != nil {
		return rf, err
	}
	if err := steps.CheckResponse(resp); err != nil {
		return rf, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&rf); err != nil {
		return rf, fmt.Errorf("decode refund: %w", err)
	}
	return rf, nil
}

// FindCharge asks whether a charge was made with key: the reconciliation
// of a charge step (engine.StepOpts.Reconcile).
func (c *GatewayClient) FindCharge(ctx context.Context, key steps.Key) (ch Charge, found bool, err error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+"/v1/charges?idempotency_key="+url.QueryEscape(string(key)), nil)
	if err != nil {
		return ch, false, err
	}
	resp, err := c.HTTP.Do(hreq)
	if err != nil {
		return ch, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return ch, false, nil
	}
	if err := steps.CheckResponse(resp); err != nil {
		return ch, false, err
	}
	if err := json.NewDecoder(resp.Body).Decode(&ch); err != nil {
		return ch, false, fmt.Errorf("decode charge: %w", err)
	}
	return ch, true, nil
}
