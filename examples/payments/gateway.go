package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

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
