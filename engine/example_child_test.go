package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/ratchet-run/ratchet/engine"
)

// An order fans out to one shipment per parcel, then awaits them: the
// order parks while they run (a worker executes them; here TakeOver
// stands in for it) and the last shipment's finish wakes it.
func ExampleStartChild() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "shipment", func(ctx context.Context, parcel string) (string, error) {
		if parcel == "lost" {
			return "", errors.New("never happens here")
		}
		return "label-" + parcel, nil
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	_, err = engine.Register(workflows, "order", func(ctx context.Context, parcels []string) ([]string, error) {
		var ids []string
		for _, p := range parcels {
			id, err := engine.StartChild(ctx, "ship-"+p, "shipment", p, &engine.ChildOpts{})
			if err != nil {
				return nil, err
			}
			ids = append(ids, id)
		}
		var labels []string
		for i, id := range ids {
			label, err := engine.AwaitChild[string](ctx, "shipped-"+parcels[i], id)
			var failed *engine.ChildError
			if errors.As(err, &failed) {
				return nil, err // permanent: the order fails with the shipment's code
			}
			if err != nil {
				return nil, err
			}
			labels = append(labels, label)
		}
		return labels, nil
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx) //nolint:errcheck
	res, err := client.Start(ctx, engine.StartParams{Workflow: "order", IdempotencyKey: "order-1", Input: []byte(`["a", "b"]`)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Run.Status, "for its first shipment")
	children, err := client.Children(ctx, res.Run.ID)
	if err != nil {
		log.Fatal(err)
	}
	for _, child := range children {
		done, err := client.TakeOver(ctx, child.ID)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(done.Workflow, done.Status, *done.ParentRunID == res.Run.ID)
	}
	final, err := client.TakeOver(ctx, res.Run.ID) // woken by the last shipment
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(final.Status, string(final.Output))

	// Child starts one and awaits it.
	_, err = engine.Register(workflows, "gift", func(ctx context.Context, to string) (string, error) {
		return engine.Child[string](ctx, "wrap", "shipment", to, nil)
	}, nil)
	fmt.Println(err == nil)
	// Output:
	// waiting for its first shipment
	// shipment succeeded true
	// shipment succeeded true
	// succeeded ["label-a", "label-b"]
	// true
}
