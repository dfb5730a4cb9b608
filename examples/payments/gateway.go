package payments

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

// charge is the part of the gateway's answer the workflow keeps.
type charge struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// charge calls POST /v1/charges. The HTTP client's transport sends the
// step's child key as Idempotency-Key, so every retry is the same charge.
func (p *Payments) charge(ctx context.Context, in Input) (charge, error) {
	var ch charge
	body, _ := json.Marshal(map[string]any{"amount": in.Amount, "currency": in.Currency, "customer": in.Customer})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.cfg.GatewayURL+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return ch, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.cfg.HTTP.Do(req)
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
		return ch, fmt.Errorf("decode the gateway's charge: %w", err)
	}
	return ch, nil
}

// refund refunds a charge with the undo's own child key, which the
// step's context carries (the transport sends it as Idempotency-Key).
func (p *Payments) refund(ctx context.Context, chargeID string) error {
	body, _ := json.Marshal(map[string]any{"charge": chargeID})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.cfg.GatewayURL+"/v1/refunds", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.cfg.HTTP.Do(req)
	if err != nil {
		return err
	}
	if err := steps.CheckResponse(resp); err != nil {
		return err // a refusal (4xx) is permanent: the run waits for an operator
	}
	return resp.Body.Close()
}

// findCharge asks the gateway whether a charge was made with key: what
// the charge step does instead of charging again when an earlier
// attempt's outcome is unknown.
func (p *Payments) findCharge(ctx context.Context, key steps.Key) (charge, bool, error) {
	var ch charge
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.cfg.GatewayURL+"/v1/charges?idempotency_key="+url.QueryEscape(string(key)), nil)
	if err != nil {
		return ch, false, err
	}
	resp, err := p.cfg.HTTP.Do(req)
	if err != nil {
		return ch, false, err
	}
	if resp.StatusCode == http.StatusNotFound {
		resp.Body.Close()
		return ch, false, nil
	}
	if err := steps.CheckResponse(resp); err != nil {
		return ch, false, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&ch); err != nil {
		return ch, false, fmt.Errorf("decode the gateway's charge: %w", err)
	}
	return ch, true, nil
}
