package engine_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ratchet-run/ratchet/engine"
)

// What a run waits for, and what will move it: one answer per unfinished
// run, and a count of them all for dashboards.
func ExampleClient_Why() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "settlement", func(ctx context.Context, transfer string) (string, error) {
		return engine.Await[string](ctx, "settled", &engine.AwaitOpts{CorrelationKey: transfer, Timeout: 24 * time.Hour})
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	res, err := client.Start(ctx, engine.StartParams{Workflow: "settlement", IdempotencyKey: "a", Input: []byte(`"tr_1"`)})
	if err != nil {
		log.Fatal(err)
	}
	run, err := client.Why(ctx, res.Run.ID)
	if err != nil {
		log.Fatal(err)
	}
	var blocked *engine.Blocked = run.Blocked
	fmt.Println(blocked.Reason, blocked.Signal, blocked.CorrelationKey)

	var summary *engine.RunsSummary
	summary, err = client.BlockedSummary(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, reason := range engine.BlockedReasons() {
		var r engine.BlockedReason = reason
		if n := summary.ByReason[r]; n > 0 {
			fmt.Println(r, n)
		}
	}
	// Output:
	// signal settled tr_1
	// signal 1
}
