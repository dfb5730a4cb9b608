package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
)

// A saga: the charge registers its refund, and the ledger phase is the
// pivot. A ledger that refuses the payment (before the pivot) undoes the
// charge: the refund is sent under a child key of its own, and the run
// finishes compensated, recording what it undid. A run past its pivot
// cannot be cancelled: it is carried through.
func ExampleAtomicOpts() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	var refunds []string
	gateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/refunds" {
			refunds = append(refunds, r.Header.Get("Idempotency-Key"))
		}
	}))
	defer gateway.Close()
	call := func(ctx context.Context, path string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, gateway.URL+path, nil)
		if err != nil {
			return err
		}
		resp, err := steps.NewClient(nil).Do(req) // sends the key in ctx as Idempotency-Key
		if err != nil {
			return err
		}
		return steps.CheckResponse(resp)
	}

	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "payment", func(ctx context.Context, in PaymentInput) (string, error) {
		charge, err := engine.Step(ctx, "charge_created", func(ctx context.Context, key steps.Key) (string, error) {
			return "ch_1", call(ctx, "/charges")
		}, &engine.StepOpts[string]{Compensate: func(ctx context.Context, key steps.Key, charge string) error {
			return call(ctx, "/refunds") // ctx carries the undo's own key
		}})
		if err != nil {
			return "", err
		}
		_, err = engine.Atomic(ctx, "ledger_posted", func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			if in.Customer == "cus_closed" {
				return struct{}{}, steps.Permanent("account_closed", errors.New("the ledger account is closed"))
			}
			return struct{}{}, nil
		}, &engine.AtomicOpts[struct{}]{Pivot: true})
		if err != nil {
			return "", err
		}
		_, err = engine.Await[string](ctx, "shipped", nil) // past the pivot
		return charge, err
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}

	refused, err := client.Start(ctx, engine.StartParams{Workflow: "payment", IdempotencyKey: "a", Input: []byte(`{"amount": 500, "customer": "cus_closed"}`)})
	if err != nil {
		log.Fatal(err)
	}
	var undone engine.Compensation
	if err := json.Unmarshal(refused.Run.Output, &undone); err != nil {
		log.Fatal(err)
	}
	fmt.Println(refused.Run.Status, refused.Run.Error.Code, undone.Compensated)
	undoKey, err := refused.Run.ChildKey("undo:charge_created")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(refunds), refunds[0] == string(undoKey))

	kept, err := client.Start(ctx, engine.StartParams{Workflow: "payment", IdempotencyKey: "b", Input: []byte(`{"amount": 500, "customer": "cus_1"}`)})
	if err != nil {
		log.Fatal(err)
	}
	_, err = client.Cancel(ctx, kept.Run.ID)
	var past *engine.PastPivotError
	fmt.Println(kept.Run.Status, errors.As(err, &past), past.Pivot, errors.Is(err, engine.ErrPastPivot))
	fmt.Println(strings.Contains(err.Error(), "carried through"))
	// Output:
	// compensated account_closed [charge_created]
	// 1 true
	// waiting true ledger_posted true
	// true
}

// Cancelling a run says what the cancellation does: a run nobody holds
// with nothing to undo is cancelled at once; one with an undo to run is
// compensated by whoever takes it next.
func ExampleCancelResult() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "hold", func(ctx context.Context, in PaymentInput) (string, error) {
		if in.Amount > 0 {
			_, err := engine.Atomic(ctx, "funds_held", func(ctx context.Context, tx pgx.Tx) (int64, error) { return in.Amount, nil },
				&engine.AtomicOpts[int64]{Compensate: func(ctx context.Context, tx pgx.Tx, held int64) error { return nil }})
			if err != nil {
				return "", err
			}
		}
		_, err := engine.Await[string](ctx, "approved", nil)
		return "", err
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	for _, input := range []string{`{"amount": 0}`, `{"amount": 300}`} {
		res, err := client.Start(ctx, engine.StartParams{Workflow: "hold", IdempotencyKey: input, Input: []byte(input)})
		if err != nil {
			log.Fatal(err)
		}
		cancelled, err := client.Cancel(ctx, res.Run.ID)
		if err != nil {
			log.Fatal(err)
		}
		var outcome engine.CancelOutcome = cancelled.Outcome
		fmt.Println(outcome, cancelled.Run.Status)
		if outcome == engine.CancelCompensates {
			run, err := client.TakeOver(ctx, res.Run.ID)
			if err != nil {
				log.Fatal(err)
			}
			fmt.Println(run.Status, string(run.Output))
		}
	}
	// Output:
	// cancelled cancelled
	// compensates waiting
	// compensated {"compensated": ["funds_held"]}
}
