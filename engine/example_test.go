package engine_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
)

type PaymentInput struct {
	Amount   int64  `json:"amount"`
	Customer string `json:"customer"`
}

type Receipt struct {
	PaymentID string `json:"payment_id"`
	ChargeID  string `json:"charge_id"`
}

// A workflow of three phases: two atomic ones around an external step. The
// example needs a migrated database (DATABASE_URL), so it is compiled but
// not run by the tests.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	gateway := steps.NewClient(nil) // sends the child key as Idempotency-Key

	workflows := engine.NewWorkflows()
	payment, err := engine.Register(workflows, "payment", func(ctx context.Context, in PaymentInput) (Receipt, error) {
		id, err := engine.Atomic(ctx, "payment_created", func(ctx context.Context, tx pgx.Tx) (string, error) {
			var id string
			err := tx.QueryRow(ctx, `INSERT INTO payments (amount, customer) VALUES ($1, $2) RETURNING id`, in.Amount, in.Customer).Scan(&id)
			return id, err
		})
		if err != nil {
			return Receipt{}, err
		}
		chargeID, err := engine.Step(ctx, "charge_created", func(ctx context.Context, key steps.Key) (string, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://gateway.example/v1/charges", nil)
			if err != nil {
				return "", err
			}
			resp, err := gateway.Do(req)
			if err != nil {
				return "", err
			}
			defer resp.Body.Close()
			if err := steps.CheckResponse(resp); err != nil {
				return "", err // classified: 4xx permanent, 5xx and timeouts retried with the same key
			}
			return resp.Header.Get("Charge-Id"), nil
		}, nil)
		if err != nil {
			return Receipt{}, err
		}
		_, err = engine.Atomic(ctx, "payment_succeeded", func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			_, err := tx.Exec(ctx, `UPDATE payments SET charge_id = $2 WHERE id = $1`, id, chargeID)
			return struct{}{}, err
		})
		return Receipt{PaymentID: id, ChargeID: chargeID}, err
	}, &engine.WorkflowOpts{Retention: engine.RetentionForever})
	if err != nil {
		log.Fatal(err)
	}

	client, err := engine.NewClient(pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	res, err := payment.Start(ctx, client, "order-42", PaymentInput{Amount: 1299, Customer: "cus_123"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	switch res.Outcome {
	case engine.OutcomeCreated, engine.OutcomeFinished:
		fmt.Println(res.Run.Status, res.Output.ChargeID)
	case engine.OutcomeInProgress:
		fmt.Println("another request is executing it; retry later")
	case engine.OutcomeResumable:
		fmt.Println("unfinished and unleased; a worker will resume it")
	}
}
