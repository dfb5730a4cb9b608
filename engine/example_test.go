package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/steps"
)

type PaymentInput struct {
	Amount   int64  `json:"amount"`
	Customer string `json:"customer"`
}

type Receipt struct {
	PaymentID int64  `json:"payment_id"`
	ChargeID  string `json:"charge_id"`
}

// exampleDatabase is a migrated database of the example's own (see
// engine/enginetest), with the application's payments table.
func exampleDatabase() *enginetest.Database {
	db, err := enginetest.NewDatabase(context.Background(), nil)
	if err != nil {
		log.Fatal(err)
	}
	_, err = db.Pool.Exec(context.Background(), `CREATE TABLE payments (id bigserial PRIMARY KEY, amount bigint, customer text, charge_id text)`)
	if err != nil {
		log.Fatal(err)
	}
	return db
}

// A workflow of three phases: two atomic ones around an external step.
// The step's call carries the run's derived child key, so a retried or
// resumed call is the same charge at the gateway.
func Example() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	gateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Charge-Id", "ch_"+r.Header.Get("Idempotency-Key")[:4])
	}))
	defer gateway.Close()
	httpClient := steps.NewClient(nil) // sends the child key as Idempotency-Key

	workflows := engine.NewWorkflows()
	payment, err := engine.Register(workflows, "payment", func(ctx context.Context, in PaymentInput) (Receipt, error) {
		id, err := engine.Atomic(ctx, "payment_created", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO payments (amount, customer) VALUES ($1, $2) RETURNING id`, in.Amount, in.Customer).Scan(&id)
			return id, err
		}, nil)
		if err != nil {
			return Receipt{}, err
		}
		chargeID, err := engine.Step(ctx, "charge_created", func(ctx context.Context, key steps.Key) (string, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, gateway.URL+"/v1/charges", nil)
			if err != nil {
				return "", err
			}
			resp, err := httpClient.Do(req)
			if err != nil {
				return "", err
			}
			defer resp.Body.Close()
			if err := steps.CheckResponse(resp); err != nil {
				return "", err // classified: 4xx permanent, 5xx and timeouts retried with the same key
			}
			return resp.Header.Get("Charge-Id"), nil
		}, &engine.StepOpts[string]{Timeout: 5 * time.Second})
		if err != nil {
			return Receipt{}, err
		}
		_, err = engine.Atomic(ctx, "payment_succeeded", func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			_, err := tx.Exec(ctx, `UPDATE payments SET charge_id = $2 WHERE id = $1`, id, chargeID)
			return struct{}{}, err
		}, nil)
		return Receipt{PaymentID: id, ChargeID: chargeID}, err
	}, &engine.WorkflowOpts{Retention: engine.RetentionForever})
	if err != nil {
		log.Fatal(err)
	}

	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx) //nolint:errcheck // nothing left running

	res, err := payment.Start(ctx, client, "order-42", PaymentInput{Amount: 1299, Customer: "cus_123"},
		&engine.StartOpts{Tenant: "acme", Wait: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(payment.Name(), res.Outcome, res.Run.Status, res.Output.PaymentID, len(res.Output.ChargeID))

	// The same key and input again: the stored result, nothing executed.
	again, err := payment.Start(ctx, client, "order-42", PaymentInput{Amount: 1299, Customer: "cus_123"}, &engine.StartOpts{Tenant: "acme"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(again.Outcome, again.Output == res.Output)

	// The same key with another input is refused.
	_, err = payment.Start(ctx, client, "order-42", PaymentInput{Amount: 1, Customer: "cus_123"}, &engine.StartOpts{Tenant: "acme"})
	var mismatch *engine.MismatchError
	fmt.Println(errors.As(err, &mismatch), errors.Is(err, engine.ErrFingerprintMismatch))

	journal, err := client.Phases(ctx, res.Run.ID)
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range journal {
		fmt.Println(p.Seq, p.Name, p.Kind, p.ChildKey != nil)
	}
	// Output:
	// payment created succeeded 1 7
	// finished true
	// true true
	// 0 payment_created atomic false
	// 1 charge_created step true
	// 2 payment_succeeded atomic false
}

// noop registers a one-phase workflow named name that returns its input.
func noop(workflows *engine.Workflows, name string) *engine.Workflow[int, int] {
	wf, err := engine.Register(workflows, name, func(ctx context.Context, in int) (int, error) {
		return engine.Atomic(ctx, "done", func(context.Context, pgx.Tx) (int, error) { return in, nil }, nil)
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	return wf
}

// Starting by name with JSON input, as the HTTP layer does, waiting at
// most a bound: the execution goes on after Start stops waiting.
func ExampleClient_Start() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	workflows := engine.NewWorkflows()
	noop(workflows, "echo")
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx) //nolint:errcheck
	fmt.Println(client.Workflows().Names(), client.Workflows().Has("echo"))

	res, err := client.Start(ctx, engine.StartParams{
		Workflow: "echo", IdempotencyKey: "req-1", Input: []byte(`7`),
		StartOpts: engine.StartOpts{Tenant: "acme", Wait: 10 * time.Second},
	})
	if err != nil {
		log.Fatal(err)
	}
	var result engine.StartResult = *res
	fmt.Println(result.Outcome.String(), result.Run.Status, result.Run.Status.Finished(), string(result.Run.Output))

	_, err = client.Start(ctx, engine.StartParams{Workflow: "nope", IdempotencyKey: "req-2", Input: []byte(`1`)})
	fmt.Println(errors.Is(err, engine.ErrUnknownWorkflow))
	_, err = client.Start(ctx, engine.StartParams{Workflow: "echo", IdempotencyKey: "req-3", Input: []byte(`"seven"`)})
	fmt.Println(errors.Is(err, engine.ErrInvalidInput))
	// Output:
	// [echo] true
	// created succeeded true 7
	// true
	// true
}

// A run created in the caller's own transaction exists iff it commits; a
// worker (or TakeOver, here) executes it after.
func ExampleClient_StartTx() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	workflows := engine.NewWorkflows()
	wf := noop(workflows, "fulfil")
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx) //nolint:errcheck

	var runID string
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (amount, customer) VALUES (5, 'cus_1')`); err != nil {
			return err
		}
		res, err := wf.StartTx(ctx, client, tx, "order-7", 5, nil)
		if err == nil {
			runID = res.Run.ID
			fmt.Println(res.Outcome, res.Run.Status)
		}
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	run, err := client.TakeOver(ctx, runID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(run.Status, string(run.Output))

	// Its untyped twin, rolled back: no run.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := client.StartTx(ctx, tx, engine.StartParams{Workflow: "fulfil", IdempotencyKey: "order-8", Input: []byte(`8`)}); err != nil {
		log.Fatal(err)
	}
	tx.Rollback(ctx) //nolint:errcheck
	runs, err := client.ListRuns(ctx, engine.ListParams{Workflow: "fulfil", Limit: 10})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(runs), runs[0].IdempotencyKey)
	// Output:
	// created pending
	// succeeded 5
	// 1 order-7
}

// Operators cancel unfinished runs and reopen failed ones; the Tx twins
// join the caller's own writes.
func ExampleClient_Cancel() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "charge", func(ctx context.Context, customer string) (string, error) {
		if customer == "cus_declined" {
			return "", steps.Permanent("card_declined", errors.New("your card was declined"))
		}
		return "ch_1", nil
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx) //nolint:errcheck

	// A run nobody executes yet, cancelled with the order it belongs to.
	var pending *engine.StartResult
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) (err error) {
		pending, err = client.StartTx(ctx, tx, engine.StartParams{Workflow: "charge", IdempotencyKey: "a", Input: []byte(`"cus_1"`)})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := client.CancelTx(ctx, tx, pending.Run.ID)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	run, err := client.GetRun(ctx, pending.Run.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(run.Status, run.Error.Code == engine.CodeCancelled)
	_, err = client.Cancel(ctx, run.ID)
	fmt.Println(errors.Is(err, engine.ErrFinished))

	// A declined card fails the run; once the customer has a new card,
	// the operator reopens it.
	failed, err := client.Start(ctx, engine.StartParams{Workflow: "charge", IdempotencyKey: "b", Input: []byte(`"cus_declined"`)})
	if err != nil {
		log.Fatal(err)
	}
	var runErr *engine.RunError = failed.Run.Error
	fmt.Println(failed.Run.Status, runErr.Code, runErr.Retryable)
	reopened, err := client.Reopen(ctx, failed.Run.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(reopened.Status)
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := client.ReopenTx(ctx, tx, failed.Run.ID)
		return err
	})
	fmt.Println(errors.Is(err, engine.ErrNotFailed))
	// Output:
	// cancelled true
	// true
	// failed card_declined false
	// pending
	// true
}
