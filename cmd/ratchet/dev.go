package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/examples/quickstart"
	"github.com/ratchet-run/ratchet/migrations"
	"github.com/ratchet-run/ratchet/worker"
)

type devCmd struct {
	dbFlags
	StaleAfter time.Duration `name:"stale-after" env:"RATCHET_STALE_AFTER" default:"2s" help:"Lease length: how long a crashed run waits before another executor takes it over (env RATCHET_STALE_AFTER)."`
}

func (c *devCmd) Run(e *env) error {
	ctx := e.ctx
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	out := func(format string, args ...any) { fmt.Fprintf(e.stdout, format+"\n", args...) }

	res, err := migrations.Apply(ctx, pool, nil)
	if err != nil {
		return err
	}
	cfg := pool.Config().ConnConfig
	out("Postgres at %s:%d/%s; schema %q migrated (%d Ratchet and %d River migrations applied now)",
		cfg.Host, cfg.Port, cfg.Database, migrations.Schema, len(res.Applied), len(res.RiverVersions))
	if err := quickstart.Setup(ctx, pool, map[string]int64{"alice": 1_000_000, "bob": 0}); err != nil {
		return err
	}

	workflows := engine.NewWorkflows()
	transfer, err := quickstart.Register(workflows)
	if err != nil {
		return err
	}
	engineCfg := engine.Config{Workflows: workflows, StaleAfter: c.StaleAfter, ID: "dev-executor-1"}
	w, err := worker.New(pool, &worker.Config{Engine: engineCfg, FetchPollInterval: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = w.Stop(stopCtx)
	}()
	client := w.Engine()

	key := "demo-" + strings.ToLower(ulid.Make().String())
	in := quickstart.TransferInput{From: "alice", To: "bob", Amount: 1299}
	out("\n1. Start %s with Idempotency-Key %q: %+v", quickstart.WorkflowName, key, in)
	first, err := transfer.Start(ctx, client, key, in, nil)
	if err != nil {
		return err
	}
	out("   %s run %s: %s at recovery point %q, output %s", first.Outcome, first.Run.ID, first.Run.Status, first.Run.RecoveryPoint, first.Run.Output)

	out("\n2. The same request again (a client retry)")
	again, err := transfer.Start(ctx, client, key, in, nil)
	if err != nil {
		return err
	}
	out("   %s: stored output replayed, nothing executed: %s", again.Outcome, again.Run.Output)

	out("\n3. The same key with a different amount")
	in2 := in
	in2.Amount = 5000
	_, err = transfer.Start(ctx, client, key, in2, nil)
	if !errors.Is(err, engine.ErrFingerprintMismatch) {
		return fmt.Errorf("expected a fingerprint mismatch, got %v", err)
	}
	out("   rejected: %v", err)

	crashKey := key + "-crash"
	out("\n4. A run whose executor dies after its first phase (key %q)", crashKey)
	crashCtx, crash := context.WithCancel(ctx)
	doomedCfg := engineCfg
	doomedCfg.ID, doomedCfg.Hooks = "dev-executor-doomed", crashAfter{phase: "debited", crash: crash}
	doomed, err := worker.New(pool, &worker.Config{Engine: doomedCfg, InsertOnly: true})
	if err != nil {
		return err
	}
	abandoned, err := transfer.Start(crashCtx, doomed.Engine(), crashKey, in, nil)
	if !errors.Is(err, context.Canceled) {
		return fmt.Errorf("expected the doomed executor to be abandoned, got %v", err)
	}
	run, err := client.Run(ctx, abandoned.Run.ID)
	if err != nil {
		return err
	}
	out("   run %s left %s at recovery point %q, leased by %s (token %d)", run.ID, run.Status, run.RecoveryPoint, *run.LeaseOwner, run.LeaseToken)
	out("   the worker will take it over once the lease is stale (stale-after %s)...", c.StaleAfter)
	began := time.Now()
	resumed, err := awaitFinished(ctx, client, run.ID)
	if err != nil {
		return err
	}
	out("   the worker took it over %s later (token %d): %s, output %s", time.Since(began).Round(10*time.Millisecond), resumed.LeaseToken, resumed.Status, resumed.Output)
	phases, err := client.Phases(ctx, run.ID)
	if err != nil {
		return err
	}
	for _, p := range phases {
		out("   journal: phase %d %-9s committed %s", p.Seq, p.Name, p.FinishedAt.Format(time.RFC3339Nano))
	}
	out("   the debit committed once, before the crash; the resumed executor replayed it from the journal and ran only the credit.")
	return nil
}

// awaitFinished polls until the run has finished: the worker resumes it in
// this process, but through River, so there is nothing to wait on here.
func awaitFinished(ctx context.Context, client *engine.Client, runID string) (*engine.Run, error) {
	ticker := time.NewTicker(50 * time.Millisecond)
	defer ticker.Stop()
	for {
		run, err := client.Run(ctx, runID)
		if err != nil || run.Status.Finished() {
			return run, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ticker.C:
		}
	}
}

// crashAfter abandons an execution as soon as the named phase commits,
// standing in for a process that dies at that point.
type crashAfter struct {
	phase string
	crash context.CancelFunc
}

func (h crashAfter) Run(ctx context.Context, _ engine.RunInfo) (context.Context, func(engine.RunEnd)) {
	return ctx, func(engine.RunEnd) {}
}

func (h crashAfter) Phase(ctx context.Context, info engine.PhaseInfo) (context.Context, func(error)) {
	return ctx, func(err error) {
		if err == nil && info.Name == h.phase && !info.Replayed {
			h.crash()
		}
	}
}
