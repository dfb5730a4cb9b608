package engine_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratchet-run/ratchet/engine"
)

type Parcel struct {
	Weight int `json:"weight"`
}

// Two versions of a workflow side by side: the run that started on v1
// finishes on v1's code, new runs start on v2. The deploy gate, run with
// the new build before it rolls out, says whether it can finish every run
// in flight; processes announce what they serve.
func ExampleClient_CheckDeploy() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	label := func(ctx context.Context, tx pgx.Tx) (string, error) { return "label", nil }
	v1 := func(ctx context.Context, p Parcel) (string, error) {
		if _, err := engine.Atomic(ctx, "labelled", label, nil); err != nil {
			return "", err
		}
		return engine.Await[string](ctx, "picked_up", nil)
	}
	v2 := func(ctx context.Context, p Parcel) (string, error) {
		if _, err := engine.Atomic(ctx, "weighed", func(ctx context.Context, tx pgx.Tx) (int, error) { return p.Weight, nil }, nil); err != nil {
			return "", err
		}
		if _, err := engine.Atomic(ctx, "labelled", label, nil); err != nil {
			return "", err
		}
		return engine.Await[string](ctx, "picked_up", nil)
	}

	// The build in production knows v1; a run is in flight on it.
	old := engine.NewWorkflows()
	if _, err := engine.Register(old, "shipping", v1, nil); err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: old})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := client.Start(ctx, engine.StartParams{Workflow: "shipping", IdempotencyKey: "a", Input: []byte(`{"weight": 3}`)}); err != nil {
		log.Fatal(err)
	}

	// A build that changed v1 in place cannot finish it ...
	inPlace := engine.NewWorkflows()
	if _, err := engine.Register(inPlace, "shipping", v2, nil); err != nil {
		log.Fatal(err)
	}
	// ... a build that adds v2 beside v1 can.
	sideBySide := engine.NewWorkflows()
	if _, err := engine.Register(sideBySide, "shipping", v1, &engine.WorkflowOpts{Version: 1, Drain: true}); err != nil {
		log.Fatal(err)
	}
	if _, err := engine.Register(sideBySide, "shipping", v2, &engine.WorkflowOpts{Version: 2}); err != nil {
		log.Fatal(err)
	}
	for _, build := range []*engine.Workflows{inPlace, sideBySide} {
		gate, err := engine.NewClient(db.Pool, &engine.Config{Workflows: build})
		if err != nil {
			log.Fatal(err)
		}
		var report *engine.DeployReport
		report, err = gate.CheckDeploy(ctx, &engine.CheckDeployOpts{Concurrency: 2})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(build.Served(), report.OK(), report.InFlight)
		for _, p := range report.Problems {
			var check engine.RunCheck = p
			var verdict engine.Verdict = check.Verdict
			fmt.Println(" ", verdict, *check.Seq, check.Journaled, "≠", check.Called)
		}
	}

	// The new build runs: it announces what it serves, and new runs start
	// on v2.
	deployed, err := engine.NewClient(db.Pool, &engine.Config{Workflows: sideBySide})
	if err != nil {
		log.Fatal(err)
	}
	if err := deployed.Announce(ctx, 15*time.Second); err != nil {
		log.Fatal(err)
	}
	res, err := deployed.Start(ctx, engine.StartParams{Workflow: "shipping", IdempotencyKey: "b", Input: []byte(`{"weight": 5}`)})
	if err != nil {
		log.Fatal(err)
	}
	served, err := deployed.Served(ctx, res.Run)
	if err != nil {
		log.Fatal(err)
	}
	processes, err := deployed.Processes(ctx)
	if err != nil {
		log.Fatal(err)
	}
	var p engine.Process = processes[0]
	fmt.Println(res.Run.WorkflowVersion, served, p.Serves)
	if err := deployed.Withdraw(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// [shipping@1] false map[shipping@1:1]
	//   incompatible 0 labelled ≠ weighed
	// [shipping@1 shipping@2] true map[shipping@1:1]
	// 2 true [shipping@1 shipping@2]
}

// A small change inside one version: runs that passed this point before
// the patch keep the old path, runs that reach it take the new one.
func ExamplePatched() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "fee", func(ctx context.Context, amount int) (int, error) {
		fee := amount / 100 // the old fee: 1%
		if engine.Patched(ctx, "fee-two-percent") {
			fee = amount / 50
		}
		return engine.Atomic(ctx, "fee_charged", func(ctx context.Context, tx pgx.Tx) (int, error) { return fee, nil }, nil)
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	res, err := client.Start(ctx, engine.StartParams{Workflow: "fee", IdempotencyKey: "a", Input: []byte(`1000`)})
	if err != nil {
		log.Fatal(err)
	}
	phases, err := client.Phases(ctx, res.Run.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(res.Run.Output), phases[0].Name, phases[0].Kind, engine.Patched(ctx, "outside a run"))
	// Output:
	// 20 patch:fee-two-percent patch true
}
