package recovery_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/recovery"
)

// A Recoverer resumes due runs with an engine client — what a worker runs,
// without River: here a run whose process crashed after its first phase.
// Prune deletes finished runs past their retention.
func ExampleRecoverer() {
	ctx := context.Background()
	db, err := enginetest.NewDatabase(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	finished := make(chan engine.Status, 1)
	workflows := engine.NewWorkflows()
	wf, err := engine.Register(workflows, "two", func(ctx context.Context, _ struct{}) (int, error) {
		for _, name := range []string{"one", "two"} {
			if _, err := engine.Atomic(ctx, name, func(context.Context, pgx.Tx) (int, error) { return 0, nil }, nil); err != nil {
				return 0, err
			}
		}
		return 2, nil
	}, &engine.WorkflowOpts{Retention: time.Microsecond})
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows, StaleAfter: 2 * time.Second, Hooks: ends(finished)})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := wf.Start(enginetest.CrashAfter(ctx, "one"), client, "k", struct{}{}, nil); err == nil {
		log.Fatal("expected the crash")
	}
	fmt.Println(<-finished)

	r, err := recovery.New(client, &recovery.Config{PollInterval: 50 * time.Millisecond, MaxExecutions: 4})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-finished) // once the lease is stale, within a poll
	r.Stop()
	if err := r.Wait(ctx); err != nil {
		log.Fatal(err)
	}

	// The run's retention (a microsecond) has passed by the database's
	// clock: a later transaction's now() is after the finish's.
	res, err := recovery.Prune(ctx, db.Pool, &recovery.PruneOpts{BatchSize: 10})
	if err != nil {
		log.Fatal(err)
	}
	var pruned recovery.PruneResult = res
	fmt.Println(pruned.Deleted, pruned.Batches > 0)
	// Output:
	// crashed
	// succeeded
	// 1 true
}

// ends reports each execution's end: its status, or "crashed".
type ends chan engine.Status

func (e ends) Run(ctx context.Context, _ engine.RunInfo) (context.Context, func(engine.RunEnd)) {
	return ctx, func(end engine.RunEnd) {
		if end.Err != nil {
			end.Status = "crashed"
		}
		e <- end.Status
	}
}

func (e ends) Phase(ctx context.Context, _ engine.PhaseInfo) (context.Context, func(error)) {
	return ctx, func(error) {}
}
