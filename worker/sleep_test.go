package worker_test

import (
	"context"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/bench"
	"github.com/ratchet-run/ratchet/worker"
)

// Many runs sleeping at once hold no connection and no goroutine, and the
// wake-up mechanism (the recoverer's poll, at its default interval) wakes
// each at its time. The suite runs 200; RATCHET_SLEEPERS=1000 is the
// measurement in the README.
func TestSleepingRunsHoldNothingAndWakeOnTime(t *testing.T) {
	// Not parallel: the goroutine count is the process's, and the
	// package's parallel tests wait until the sequential ones are done.
	n := 200
	if v, err := strconv.Atoi(os.Getenv("RATCHET_SLEEPERS")); err == nil && v > 0 {
		n = v
	}
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	woke := make(chan struct{}, n)
	_, err := engine.Register(workflows, "sleeper", func(ctx context.Context, d time.Duration) (int, error) {
		if err := engine.Sleep(ctx, "nap", d); err != nil {
			return 0, err
		}
		woke <- struct{}{}
		return 1, nil
	}, nil)
	require.NoError(t, err)
	w, err := worker.New(b.pool, &worker.Config{Engine: engine.Config{Workflows: workflows}}) // the default poll: 500ms
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	// Warm up as the measured batch will run (eight at a time), with runs
	// that sleep for nothing: the pool's connections and River's workers
	// then exist before the baseline is taken.
	_, err = bench.Drive(ctx, 8, 16, 0, func(ctx context.Context, i int) error {
		_, err := w.Engine().Start(ctx, engine.StartParams{Workflow: "sleeper", IdempotencyKey: "warm-" + strconv.Itoa(i), Input: []byte(`0`)})
		return err
	})
	require.NoError(t, err)
	for range 16 {
		<-woke
	}
	baseline := runtime.NumGoroutine()

	// Wake times 10 s after each start, spread over a second per 200 runs,
	// so that every run is parked before the first wakes, on a loaded
	// machine too (200 park in about a second when it is quiet).
	spread := time.Duration(n) * 5 * time.Millisecond
	began := time.Now()
	_, err = bench.Drive(ctx, 8, n, 0, func(ctx context.Context, i int) error {
		d := 10*time.Second + spread*time.Duration(i)/time.Duration(n)
		res, err := w.Engine().Start(ctx, engine.StartParams{Workflow: "sleeper", IdempotencyKey: strconv.Itoa(i), Input: []byte(strconv.FormatInt(int64(d), 10))})
		if err == nil && res.Run.Status != engine.StatusWaiting {
			t.Errorf("run %d is %s, not waiting", i, res.Run.Status)
		}
		return err
	})
	require.NoError(t, err)
	parked := time.Since(began)
	require.Less(t, parked, 10*time.Second, "every run parked before the first wakes (else the measure below is not of sleeping runs)")

	// All sleep: what does the process hold?
	var waiting int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs WHERE status = 'waiting' AND lease_owner IS NULL`).Scan(&waiting))
	require.Equal(t, n, waiting)
	// Executions that parked their runs may still be unwinding, and the
	// pool may have grown (a loaded machine): the count settles before the
	// first run wakes. A goroutine per sleeping run would be n more; the
	// bound allows a tenth of that for what a loaded machine leaves
	// about (under CI load six, then ten, were seen at the moment of the
	// count).
	bound := baseline + max(5, n/10)
	goroutines := runtime.NumGoroutine()
	for settle := began.Add(9500 * time.Millisecond); goroutines > bound && time.Now().Before(settle); goroutines = runtime.NumGoroutine() {
		time.Sleep(20 * time.Millisecond)
	}
	held := b.pool.Stat().AcquiredConns()
	t.Logf("%d runs parked in %s; while they sleep: %d goroutines (%d before), %d connections in use", n, parked.Round(time.Millisecond), goroutines, baseline, held)
	if goroutines > bound {
		var stacks strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		t.Fatalf("%d goroutines while %d runs sleep, %d before: no goroutine per sleeping run, the pool's and River's, warmed up, are a constant\n%s",
			goroutines, n, baseline, stacks.String())
	}
	require.LessOrEqual(t, held, int32(2), "no connection per sleeping run (the poll, this query)")

	for range n {
		select {
		case <-woke:
		case <-time.After(time.Minute):
			t.Fatal("not every run woke")
		}
	}
	// Lateness by the database's clock: the sleep phase's commit against
	// its wake time.
	rows, err := b.pool.Query(ctx, `
		SELECT extract(epoch FROM p.finished_at - (p.output->>'until')::timestamptz)
		FROM ratchet.phases p JOIN ratchet.runs r ON r.id = p.run_id
		WHERE p.kind = 'sleep' AND r.idempotency_key NOT LIKE 'warm-%'`)
	require.NoError(t, err)
	var late []time.Duration
	for rows.Next() {
		var s float64
		require.NoError(t, rows.Scan(&s))
		late = append(late, time.Duration(s*float64(time.Second)))
	}
	require.NoError(t, rows.Err())
	require.Len(t, late, n)
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	for _, l := range late {
		require.GreaterOrEqual(t, l, time.Duration(0), "no run woke before its time")
	}
	p := func(q float64) time.Duration { return late[int(q*float64(len(late)-1))] }
	t.Logf("woken late by p50 %s, p99 %s, max %s", p(0.5).Round(time.Millisecond), p(0.99).Round(time.Millisecond), late[len(late)-1].Round(time.Millisecond))
	// A sanity bound (30 polls), not a verdict on the machine's speed:
	// the figure is the log above.
	require.Less(t, p(0.99), 15*time.Second, "a sanity bound; the figure is the log above")
}

// Processes killed while runs sleep, and as a woken run executes: the
// runs finish once each, each phase's effect and the charge once.
func TestWorkersKilledWhileRunsSleepAndAsTheyWakeFinishThemOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	env := b.env("STALE_AFTER=2s")
	first := startWorkerProc(t, env...)

	workflows := engine.NewWorkflows()
	require.NoError(t, addOrderFlow(workflows, b.gwURL, &pauser{}))
	creator, err := engine.NewClient(b.pool, &engine.Config{Workflows: workflows})
	require.NoError(t, err)
	keys := []string{"n1", "n2", "n3"}
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for _, key := range keys {
			if _, err := creator.StartTx(ctx, tx, engine.StartParams{Workflow: "order", IdempotencyKey: key, Input: napInput(key, 1500*time.Millisecond)}); err != nil {
				return err
			}
		}
		return nil
	}))
	// The first worker executes them up to their nap.
	require.Eventually(t, func() bool { // an observable state of the database, not a timing guess
		var waiting int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs WHERE status = 'waiting'`).Scan(&waiting))
		return waiting == len(keys)
	}, 30*time.Second, 20*time.Millisecond)
	first.Signal(syscall.SIGKILL) // while they sleep: it held nothing of theirs
	require.Error(t, first.Wait())

	// The second wakes them and dies as the first woken run goes on.
	second := startWorkerProc(t, append(env, "PAUSE_AT=napped.after-wake")...)
	second.Expect("AT napped.after-wake ")
	second.Signal(syscall.SIGKILL)
	require.Error(t, second.Wait())

	startWorkerProc(t, env...)
	b.awaitFinished(t, 30*time.Second, keys...)
	b.requireExactlyOnce(t, keys...)
	var naps int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.phases WHERE name = 'napped'`).Scan(&naps))
	require.Equal(t, len(keys), naps, "each sleep committed once")
}

// A process killed while it delivers a signal (its transaction open) has
// delivered nothing; the provider's retry, to another process, is
// consumed once, and the run finishes once.
func TestAProcessKilledWhileDeliveringASignalDeliversItOnceOnRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	env := b.env("STALE_AFTER=2s")
	receiver := startWorkerProc(t, env...)

	workflows := engine.NewWorkflows()
	require.NoError(t, addApprovalFlow(workflows))
	creator, err := engine.NewClient(b.pool, &engine.Config{Workflows: workflows})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := creator.StartTx(ctx, tx, engine.StartParams{Workflow: "approval", IdempotencyKey: "a1", Input: orderInput("a1")})
		return err
	}))
	require.Eventually(t, func() bool { // an observable state of the database
		return b.run(t, "a1").Status == "waiting"
	}, 30*time.Second, 20*time.Millisecond)

	deliverer := startWorkerProc(t, append(env, "PAUSE_AT=signal.before-commit")...)
	deliverer.Send("signal evt_1 a1")
	deliverer.Expect("AT signal.before-commit a1")
	deliverer.Signal(syscall.SIGKILL)
	require.Error(t, deliverer.Wait())
	require.Equal(t, "waiting", b.run(t, "a1").Status, "the killed delivery woke nothing")

	receiver.Send("signal evt_1 a1") // the provider retries the same event
	receiver.Expect("SIGNALLED evt_1")
	b.awaitFinished(t, 30*time.Second, "a1")
	effects := b.effects(t)
	require.Equal(t, 1, effects[[2]string{"a1", "reserved"}])
	require.Equal(t, 1, effects[[2]string{"a1", "posted"}])
	var signals, consumed int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*), count(consumed_by) FROM ratchet.signals`).Scan(&signals, &consumed))
	require.Equal(t, [2]int{1, 1}, [2]int{signals, consumed}, "one signal, consumed once")
}
