package enginetest_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
)

// A database of its own for code without a testing.TB, such as an
// example; tests call New, which drops it when the test ends. See
// examples/refunds for a workflow's tests written with the kit.
func ExampleNewDatabase() {
	ctx := context.Background()
	db, err := enginetest.NewDatabase(ctx, &enginetest.Options{MaxConns: 4})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	workflows := engine.NewWorkflows()
	wf, err := engine.Register(workflows, "two", func(ctx context.Context, _ struct{}) (int, error) {
		for _, name := range []string{"reserved", "captured"} {
			if _, err := engine.Atomic(ctx, name, func(context.Context, pgx.Tx) (int, error) { return 0, nil }, nil); err != nil {
				return 0, err
			}
		}
		return 1, nil
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	res, err := wf.Start(enginetest.CrashAfter(ctx, "reserved"), client, "k", struct{}{}, nil)
	fmt.Println(err != nil, db.URL != "", enginetest.AdminURL() != "")

	run, err := db.Recover(ctx, client, res.Run.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(run.Status, run.Attempt)
	// Output:
	// true true true
	// succeeded 2
}
