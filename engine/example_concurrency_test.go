package engine_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"time"

	"github.com/ratchet-run/ratchet/engine"
)

// One customer's refunds one at a time: the second refund of cus_1 is
// created and queued while the first holds the key's slot (parked for an
// approval, it keeps it), and runs once the first finishes and passes the
// slot on.
func ExampleConcurrency() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	type refund struct {
		Customer string `json:"customer"`
		ID       string `json:"id"`
	}
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "refund", func(ctx context.Context, in refund) (string, error) {
		return engine.Await[string](ctx, "approved", &engine.AwaitOpts{CorrelationKey: in.ID, Timeout: time.Hour})
	}, &engine.WorkflowOpts{Concurrency: &engine.Concurrency{Key: "customer", Limit: 1}})
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx) //nolint:errcheck
	start := func(id string) *engine.Run {
		res, err := client.Start(ctx, engine.StartParams{Workflow: "refund", IdempotencyKey: id,
			Input: []byte(fmt.Sprintf(`{"customer":"cus_1","id":%q}`, id))})
		if err != nil {
			log.Fatal(err)
		}
		return res.Run
	}
	first := start("re_1")
	fmt.Println(first.Status, first.HoldsSlot)
	second := start("re_2")
	fmt.Println(second.Status, second.HoldsSlot)
	why, err := client.Why(ctx, second.ID)
	if err != nil {
		log.Fatal(err)
	}
	var blocked *engine.Blocked = why.Blocked
	fmt.Println(blocked.Reason == engine.BlockedConcurrency, blocked.ConcurrencyKey, blocked.Limit, slices.Equal(blocked.Holders, []string{first.ID}))

	if _, err := client.Signal(ctx, engine.SignalParams{Name: "approved", EventID: "ev_1", CorrelationKey: "re_1", Payload: []byte(`"ok"`)}); err != nil {
		log.Fatal(err)
	}
	done, err := client.TakeOver(ctx, first.ID) // what a worker does at once
	if err != nil {
		log.Fatal(err)
	}
	<-client.Ready() // a worker polls at once on it
	fmt.Println(done.Status, done.HoldsSlot)
	next, err := client.TakeOver(ctx, second.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(next.Status, next.HoldsSlot)

	// Every slot given up passed in the statement that gave it up: the
	// sweep workers run for the rest (a raised limit) finds none.
	n, err := client.PassFreeSlots(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(n)
	// Output:
	// waiting true
	// pending false
	// true refund/cus_1 1 true
	// succeeded false
	// waiting true
	// 0
}
