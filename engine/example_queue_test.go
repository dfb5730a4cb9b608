package engine_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ratchet-run/ratchet/engine"
)

// A queue in front of a mail provider: one send at a time, at most 100 a
// minute across every process, an urgent mail ahead of a newsletter. A
// worker's recoverer calls ClaimQueued and Continue on every poll; here
// the example calls them itself.
func ExampleQueue() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "send-mail", func(ctx context.Context, to string) (string, error) {
		return "sent to " + to, nil
	}, &engine.WorkflowOpts{Queue: "mail"})
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows, Queues: []engine.Queue{
		{Name: "mail", Concurrency: 1, Rate: engine.Rate{Limit: 100, Period: time.Minute}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx) //nolint:errcheck
	start := func(key, to string, priority int) *engine.Run {
		res, err := client.Start(ctx, engine.StartParams{Workflow: "send-mail", IdempotencyKey: key, Input: []byte(fmt.Sprintf("%q", to)), StartOpts: engine.StartOpts{Priority: priority}})
		if err != nil {
			log.Fatal(err)
		}
		return res.Run
	}
	newsletter := start("news-1", "all@example.com", 0)
	start("reset-1", "ann@example.com", 10)
	<-client.Ready() // a run entered a queue: a worker polls at once
	fmt.Println(newsletter.Status, newsletter.WaitingFor.Kind == engine.KindQueue)

	claimed, err := client.ClaimQueued(ctx, 10)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(claimed), claimed[0].IdempotencyKey, "first: the higher priority")
	why, err := client.Why(ctx, newsletter.ID)
	if err != nil {
		log.Fatal(err)
	}
	var state *engine.QueueState = why.Blocked.QueueState
	fmt.Println(why.Blocked.Reason == engine.BlockedQueued, state.Executing, state.Concurrency, state.Ahead)

	done, err := client.Continue(ctx, claimed[0])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(done.Status, string(done.Output))
	claimed, err = client.ClaimQueued(ctx, 10)
	if err != nil {
		log.Fatal(err)
	}
	done, err = client.Continue(ctx, claimed[0])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(done.IdempotencyKey, done.Status)
	// Output:
	// pending true
	// 1 reset-1 first: the higher priority
	// true 1 1 0
	// succeeded "sent to ann@example.com"
	// news-1 succeeded
}
