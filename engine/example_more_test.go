package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/steps"
)

// A process without a worker — a cron job, a serverless function — can
// drain due runs itself: ClaimDue leases them in one statement, Continue
// executes each.
func ExampleClient_ClaimDue() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	workflows := engine.NewWorkflows()
	wf := noop(workflows, "nightly")
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows, ID: "cron-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx) //nolint:errcheck
	fmt.Println(client.ID())
	for i := range 3 {
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := wf.StartTx(ctx, client, tx, fmt.Sprint("job-", i), i, nil)
			return err
		}); err != nil {
			log.Fatal(err)
		}
	}

	due, err := client.ClaimDue(ctx, 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, run := range due {
		done, err := client.Continue(ctx, run)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(done.IdempotencyKey, done.Status, *run.LeaseOwner)
	}
	// Unordered output:
	// cron-1
	// job-0 succeeded cron-1
	// job-1 succeeded cron-1
	// job-2 succeeded cron-1
}

// Inside a run, RunInfoFrom tells the code which run and attempt it is,
// for logs and correlation.
func ExampleRunInfoFrom() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "whoami", func(ctx context.Context, _ struct{}) (string, error) {
		info, ok := engine.RunInfoFrom(ctx)
		return fmt.Sprint(ok, " ", info.Tenant, " ", info.Workflow, " v", info.Version, " attempt ", info.Attempt), nil
	}, &engine.WorkflowOpts{Version: 3})
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx) //nolint:errcheck
	res, err := client.Start(ctx, engine.StartParams{Workflow: "whoami", IdempotencyKey: "k", Input: []byte(`{}`), StartOpts: engine.StartOpts{Tenant: "acme"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(res.Run.Output))
	_, ok := engine.RunInfoFrom(ctx)
	fmt.Println(ok)
	// Output:
	// "true acme whoami v3 attempt 1"
	// false
}

// A dunning flow knows when to try a card again (steps.RetryAfter); a
// workflow's RetryPolicy bounds how long it keeps trying before the run
// fails with retries_exhausted.
func ExampleRetryPolicy() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "dunning", func(ctx context.Context, _ struct{}) (int, error) {
		return 0, steps.RetryAfter(24*time.Hour, errors.New("insufficient funds"))
	}, &engine.WorkflowOpts{
		Retry:         &engine.RetryPolicy{MaxAttempts: 2},
		ErrorStatuses: map[string]int{engine.CodeRetriesExhausted: 402},
	})
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx) //nolint:errcheck
	res, err := client.Start(ctx, engine.StartParams{Workflow: "dunning", IdempotencyKey: "invoice-9", Input: []byte(`{}`)})
	if err != nil {
		log.Fatal(err)
	}
	run := res.Run
	fmt.Println(run.Status, run.NextAttemptAt.Sub(run.UpdatedAt).Round(time.Hour))

	// A worker executes it again tomorrow; TakeOver does now: the second
	// and last attempt.
	run, err = client.TakeOver(ctx, run.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(run.Status, run.Error.Code, *run.ResponseStatus)
	// Output:
	// pending 24h0m0s
	// failed retries_exhausted 402
}

// phaseLog is a Hooks implementation that records phase boundaries, as a
// metrics or audit layer would.
type phaseLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *phaseLog) Run(ctx context.Context, info engine.RunInfo) (context.Context, func(engine.RunEnd)) {
	return ctx, func(end engine.RunEnd) { l.add(fmt.Sprint("run ", info.Workflow, " ended ", end.Status, " ", end.Err)) }
}

func (l *phaseLog) Phase(ctx context.Context, info engine.PhaseInfo) (context.Context, func(error)) {
	return ctx, func(err error) {
		var kind engine.PhaseKind = info.Kind
		l.add(fmt.Sprint("phase ", info.Seq, " ", info.Name, " ", kind, " replayed=", info.Replayed, " ", err))
	}
}

func (l *phaseLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
}

func ExampleHooks() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	workflows := engine.NewWorkflows()
	noop(workflows, "audited")
	var hooks engine.Hooks = &phaseLog{}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows, Hooks: hooks})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx) //nolint:errcheck
	if _, err := client.Start(ctx, engine.StartParams{Workflow: "audited", IdempotencyKey: "k", Input: []byte(`1`)}); err != nil {
		log.Fatal(err)
	}
	for _, line := range hooks.(*phaseLog).lines {
		fmt.Println(line)
	}
	// Output:
	// phase 0 done atomic replayed=false <nil>
	// run audited ended succeeded <nil>
}

// A process that crashed after the first phase: a second process cannot
// take the run over while the lease is live, and continues it from its
// recovery point once it is not.
func ExampleClient_TakeOver() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	executed := map[string]int{}
	var mu sync.Mutex
	workflows := engine.NewWorkflows()
	wf, err := engine.Register(workflows, "two", func(ctx context.Context, _ struct{}) (int, error) {
		for _, name := range []string{"first", "second"} {
			if _, err := engine.Atomic(ctx, name, func(context.Context, pgx.Tx) (int, error) {
				mu.Lock()
				executed[name]++
				mu.Unlock()
				return 0, nil
			}, nil); err != nil {
				return 0, err
			}
		}
		return 2, nil
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	dead, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	res, err := wf.Start(enginetest.CrashAfter(ctx, "first"), dead, "k", struct{}{}, nil)
	fmt.Println(errors.Is(err, enginetest.ErrCrashed))
	crashed, err := dead.GetRun(ctx, res.Run.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(crashed.Status, crashed.RecoveryPoint)

	successor, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	defer successor.Shutdown(ctx) //nolint:errcheck
	_, err = successor.TakeOver(ctx, res.Run.ID)
	var held *engine.LeaseHeldError
	fmt.Println(errors.As(err, &held), errors.Is(err, engine.ErrLeaseHeld))

	run, err := db.Recover(ctx, successor, res.Run.ID) // as if the lease had gone stale
	if err != nil {
		log.Fatal(err)
	}
	keys := make([]string, 0, len(executed))
	for k := range executed {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Println(run.Status, run.Attempt, keys, executed["first"], executed["second"])
	// Output:
	// true
	// running first
	// true true
	// succeeded 2 [first second] 1 1
}

// Workflow code must call the same phases in the same order on every
// execution; a build that does not is stopped, not allowed to guess.
func ExampleNonDeterminismError() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	register := func(phase string) *engine.Workflows {
		workflows := engine.NewWorkflows()
		_, err := engine.Register(workflows, "order", func(ctx context.Context, _ struct{}) (int, error) {
			for _, name := range []string{phase, "shipped"} {
				if _, err := engine.Atomic(ctx, name, func(context.Context, pgx.Tx) (int, error) { return 0, nil }, nil); err != nil {
					var nd *engine.NonDeterminismError
					if errors.As(err, &nd) {
						fmt.Println("the phase says:", nd)
					}
					return 0, err
				}
			}
			return 1, nil
		}, nil)
		if err != nil {
			log.Fatal(err)
		}
		return workflows
	}
	old, err := engine.NewClient(db.Pool, &engine.Config{Workflows: register("reserved")})
	if err != nil {
		log.Fatal(err)
	}
	res, err := old.Start(enginetest.CrashAfter(ctx, "reserved"), engine.StartParams{Workflow: "order", IdempotencyKey: "k", Input: []byte(`{}`)})
	fmt.Println(errors.Is(err, enginetest.ErrCrashed))

	// The next build renamed the first phase.
	changed, err := engine.NewClient(db.Pool, &engine.Config{Workflows: register("stock_reserved")})
	if err != nil {
		log.Fatal(err)
	}
	defer changed.Shutdown(ctx) //nolint:errcheck
	run, err := db.Recover(ctx, changed, res.Run.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(run.Status, run.Error.Code == engine.CodeNonDeterminism)
	// Output:
	// true
	// the phase says: engine: non-determinism: phase 0 is "reserved" in the journal but the workflow called "stock_reserved"
	// failed true
}

// Ping suits a readiness probe: the database answers and is migrated.
func ExampleClient_Ping() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: engine.NewWorkflows()})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(client.Ping(ctx))
	if err := client.Shutdown(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = client.Start(ctx, engine.StartParams{Workflow: "any", IdempotencyKey: "k"})
	fmt.Println(errors.Is(err, engine.ErrShutdown))
	// Output:
	// <nil>
	// true
}

// A cooling-off period before a payout: the run parks, holding no
// connection, goroutine or job, and a worker wakes it at its time.
func ExampleSleep() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "payout", func(ctx context.Context, at time.Time) (string, error) {
		if err := engine.Sleep(ctx, "cooling_off", 14*24*time.Hour); err != nil {
			return "", err // parked: this execution ends here
		}
		if err := engine.SleepUntil(ctx, "banking_day", at); err != nil {
			return "", err
		}
		return "paid out", nil
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx) //nolint:errcheck
	res, err := client.Start(ctx, engine.StartParams{Workflow: "payout", IdempotencyKey: "po-1", Input: []byte(`"2026-01-05T09:00:00Z"`)})
	if err != nil {
		log.Fatal(err)
	}
	var wait *engine.Wait = res.Run.WaitingFor
	fmt.Println(res.Run.Status, wait.Kind, wait.Phase, res.Run.DueAt.Sub(res.Run.UpdatedAt).Round(time.Hour))

	// Two weeks on (the wait is cut short here), the run wakes: the first
	// sleep commits, and the second one's time has long passed.
	if _, err := db.Pool.Exec(ctx, `UPDATE ratchet.runs SET waiting_for = jsonb_set(waiting_for, '{until}', to_jsonb(now())) WHERE id = $1`, res.Run.ID); err != nil {
		log.Fatal(err)
	}
	run, err := client.TakeOver(ctx, res.Run.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(run.Status, string(run.Output))
	// Output:
	// waiting sleep cooling_off 336h0m0s
	// succeeded "paid out"
}

// A payout waits for the bank's webhook, matched by the transfer id the
// bank echoes; the webhook handler records the provider's event and
// signals the run in one transaction. A redelivered webhook is a no-op.
func ExampleAwait() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE webhook_events (id text PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	type settlement struct {
		Status string `json:"status"`
	}
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "payout", func(ctx context.Context, transferID string) (string, error) {
		s, err := engine.Await[settlement](ctx, "bank_settled", &engine.AwaitOpts{CorrelationKey: transferID, Timeout: 72 * time.Hour})
		var timeout *engine.AwaitTimeoutError
		if errors.As(err, &timeout) {
			return "", steps.Permanent("settlement_timed_out", err)
		}
		return s.Status, err
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx) //nolint:errcheck
	res, err := client.Start(ctx, engine.StartParams{Workflow: "payout", IdempotencyKey: "po-7", Input: []byte(`"tr_123"`)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Run.Status, res.Run.WaitingFor.Signal, res.Run.WaitingFor.CorrelationKey)

	webhook := func(eventID string) *engine.SignalResult {
		var out *engine.SignalResult
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO webhook_events VALUES ($1) ON CONFLICT DO NOTHING`, eventID); err != nil {
				return err
			}
			var err error
			out, err = client.SignalTx(ctx, tx, engine.SignalParams{
				Name: "bank_settled", EventID: eventID, CorrelationKey: "tr_123", Payload: []byte(`{"status":"settled"}`),
			})
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
		return out
	}
	first := webhook("evt_1")
	fmt.Println(first.Delivered, first.Replayed, first.RunID == res.Run.ID)
	again := webhook("evt_1") // the bank sends it twice
	fmt.Println(again.Delivered, again.Replayed)

	run, err := client.TakeOver(ctx, res.Run.ID) // what a worker does at once
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(run.Status, string(run.Output))

	// A signal to a run by id, with nothing awaiting it: refused, as a
	// finished run will never consume it.
	_, err = client.Signal(ctx, engine.SignalParams{Name: "bank_settled", EventID: "evt_2", RunID: run.ID, Payload: []byte(`{}`)})
	fmt.Println(errors.Is(err, engine.ErrFinished))
	// Output:
	// waiting bank_settled tr_123
	// true false true
	// true true
	// succeeded "settled"
	// true
}
