package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/steps"
)

// Every blocked reason, each produced by the situation that causes it.
func TestEveryBlockedReasonFromARealSituation(t *testing.T) {
	t.Parallel()
	b := setupSaga(t, &engine.Config{Queues: []engine.Queue{{Name: "held"}, {Name: "metered", Rate: engine.Rate{Limit: 1, Period: time.Hour}}}})
	ctx := context.Background()
	workflows := b.c.Workflows()
	inStep, release := make(chan struct{}, 1), make(chan struct{})
	t.Cleanup(func() { close(release) })
	reg := func(name string, fn func(context.Context, struct{}) (string, error), opts *engine.WorkflowOpts) {
		t.Helper()
		_, err := engine.Register(workflows, name, fn, opts)
		require.NoError(t, err)
	}
	reg("busy", func(ctx context.Context, _ struct{}) (string, error) {
		return engine.Step(ctx, "called", func(ctx context.Context, _ steps.Key) (string, error) {
			inStep <- struct{}{}
			<-release
			return "", nil
		}, nil)
	}, nil)
	reg("flaky", func(ctx context.Context, _ struct{}) (string, error) {
		return "", errors.New("the ledger is down")
	}, &engine.WorkflowOpts{Retry: &engine.RetryPolicy{InitialInterval: time.Hour, MaxInterval: time.Hour}})
	reg("soon", func(ctx context.Context, _ struct{}) (string, error) {
		return "", errors.New("a moment's outage")
	}, &engine.WorkflowOpts{Retry: &engine.RetryPolicy{InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}})
	reg("nap", func(ctx context.Context, _ struct{}) (string, error) {
		return "", engine.Sleep(ctx, "napped", time.Hour)
	}, nil)
	reg("approval", func(ctx context.Context, _ struct{}) (string, error) {
		return engine.Await[string](ctx, "approved", &engine.AwaitOpts{CorrelationKey: "tr_1", Timeout: time.Hour})
	}, nil)
	reg("serial", func(ctx context.Context, _ struct{}) (string, error) {
		return engine.Await[string](ctx, "approved", nil)
	}, &engine.WorkflowOpts{Concurrency: &engine.Concurrency{Limit: 1}})
	reg("kid", func(ctx context.Context, _ struct{}) (string, error) {
		return engine.Await[string](ctx, "never", nil)
	}, nil)
	reg("parent", func(ctx context.Context, _ struct{}) (string, error) {
		id, err := engine.StartChild(ctx, "kid", "kid", struct{}{}, nil)
		if err != nil {
			return "", err
		}
		return engine.AwaitChild[string](ctx, "kid.done", id)
	}, nil)
	reg("quick", func(ctx context.Context, _ struct{}) (string, error) { return "done", nil }, nil)
	reg("unknown", func(ctx context.Context, _ struct{}) (string, error) {
		return engine.Step(ctx, "charged", func(ctx context.Context, _ steps.Key) (string, error) {
			return "", &steps.IndeterminateError{Err: errors.New("connection reset")}
		}, &engine.StepOpts[string]{Policy: &steps.Policy{InitialInterval: 250 * time.Millisecond, Jitter: -1, MaxAttempts: 2},
			Timeout: 100 * time.Millisecond, KeyWindow: 300 * time.Millisecond})
	}, nil)
	start := func(workflow, key string) *engine.Run {
		t.Helper()
		res, err := b.c.Start(ctx, engine.StartParams{Workflow: workflow, IdempotencyKey: key, Input: []byte(`{}`), StartOpts: engine.StartOpts{Wait: -1}})
		require.NoError(t, err)
		return res.Run
	}
	finished := func(workflow, key string) *engine.Run {
		t.Helper()
		res, err := b.c.Start(ctx, engine.StartParams{Workflow: workflow, IdempotencyKey: key, Input: []byte(`{}`)})
		require.NoError(t, err)
		return res.Run
	}
	why := func(id string) *engine.Blocked {
		t.Helper()
		run, err := b.c.Why(ctx, id)
		require.NoError(t, err)
		require.NotNil(t, run.Blocked, "run %s (%s)", id, run.Status)
		require.NotEmpty(t, run.Blocked.Detail)
		return run.Blocked
	}

	busy := start("busy", "busy")
	receive(t, inStep)
	w := why(busy.ID)
	require.Equal(t, engine.BlockedExecuting, w.Reason)
	require.Equal(t, b.c.ID(), w.Owner)
	require.NotNil(t, w.Until)

	cancelled := start("busy", "cancel")
	receive(t, inStep)
	_, err := b.c.Cancel(ctx, cancelled.ID)
	require.NoError(t, err)
	require.Equal(t, engine.BlockedCancelPending, why(cancelled.ID).Reason)

	// No process serves anything yet: a run due now is unserved.
	soon := finished("soon", "soon")
	require.Eventually(t, func() bool { return why(soon.ID).Reason == engine.BlockedUnserved }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, b.c.Announce(ctx, time.Minute))
	w = why(soon.ID)
	require.Equal(t, engine.BlockedDue, w.Reason, "served, due, and nobody takes it: no worker polls")
	require.NotNil(t, w.Since)

	flaky := finished("flaky", "flaky")
	w = why(flaky.ID)
	require.Equal(t, engine.BlockedBackingOff, w.Reason)
	require.Equal(t, engine.CodeInternal, w.Error.Code)
	require.Equal(t, 1, w.Streak)
	_, err = b.c.TakeOver(ctx, flaky.ID) // fails the same way again
	require.NoError(t, err)
	require.Equal(t, 2, why(flaky.ID).Streak, "the same error twice in a row")

	nap := finished("nap", "nap")
	w = why(nap.ID)
	require.Equal(t, engine.BlockedTimer, w.Reason)
	require.Equal(t, "napped", w.Phase)
	require.WithinDuration(t, time.Now().Add(time.Hour), *w.Until, time.Minute)

	approval := finished("approval", "approval")
	w = why(approval.ID)
	require.Equal(t, engine.BlockedSignal, w.Reason)
	require.Equal(t, "approved", w.Signal)
	require.Equal(t, "tr_1", w.CorrelationKey)
	require.NotNil(t, w.Until, "its timeout")

	holder := finished("serial", "serial-1") // awaits, keeping its slot
	queued := finished("serial", "serial-2")
	w = why(queued.ID)
	require.Equal(t, engine.BlockedConcurrency, w.Reason)
	require.Equal(t, "serial", w.ConcurrencyKey)
	require.Equal(t, 1, w.Limit)
	require.Equal(t, []string{holder.ID}, w.Holders)

	// A queue with a rate limit of one start an hour: the second run
	// waits for the hour to pass. A run in a queue nothing has started
	// from waits for a worker to start it.
	inQueue := func(queue, key string) *engine.Run {
		t.Helper()
		res, err := b.c.Start(ctx, engine.StartParams{Workflow: "quick", IdempotencyKey: key, Input: []byte(`{}`), StartOpts: engine.StartOpts{Queue: queue}})
		require.NoError(t, err)
		return res.Run
	}
	inQueue("metered", "metered-1")
	limited := inQueue("metered", "metered-2")
	started, err := b.c.ClaimQueued(ctx, 10)
	require.NoError(t, err)
	require.Len(t, started, 1)
	_, err = b.c.Continue(ctx, started[0])
	require.NoError(t, err)
	none, err := b.c.ClaimQueued(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, none)
	w = why(limited.ID)
	require.Equal(t, engine.BlockedRateLimited, w.Reason)
	require.Equal(t, "metered", w.Queue)
	require.WithinDuration(t, time.Now().Add(time.Hour), *w.Until, time.Minute)
	waiting := inQueue("held", "held-1")
	w = why(waiting.ID)
	require.Equal(t, engine.BlockedQueued, w.Reason)
	require.Equal(t, "held", w.Queue)
	require.Zero(t, w.QueueState.Ahead)

	parent := finished("parent", "parent")
	kids, err := b.c.Children(ctx, parent.ID)
	require.NoError(t, err)
	require.Len(t, kids, 1)
	_, err = b.c.TakeOver(ctx, kids[0].ID) // as a worker would: it parks for its signal
	require.NoError(t, err)
	w = why(parent.ID)
	require.Equal(t, engine.BlockedChild, w.Reason)
	require.Equal(t, kids[0].ID, w.Child)
	require.Equal(t, "kid.done", w.Phase)

	unknown := finished("unknown", "unknown")
	w = why(unknown.ID)
	require.Equal(t, engine.BlockedNeedsReconciliation, w.Reason)
	require.Equal(t, "charged", w.Phase)
	require.Equal(t, childKey(t, unknown, "charged"), w.ChildKey)

	b.gateway.SetFaults(fakes.Faults{RefundsDown: true})
	compensating := b.start(t, ctx, "compensating", sagaOrder{Customer: "cus_1", RefuseLedger: true})
	w = why(compensating.ID)
	require.Equal(t, engine.BlockedCompensating, w.Reason)
	require.Equal(t, engine.CodeStepExhausted, w.Error.Code)
	b.gateway.SetFaults(fakes.Faults{RefuseRefunds: true})
	stuck := b.start(t, ctx, "stuck", sagaOrder{Customer: "cus_1", RefuseLedger: true})
	w = why(stuck.ID)
	require.Equal(t, engine.BlockedCompensationStuck, w.Reason)
	require.Equal(t, "undo:charge_created", w.Phase)
	require.Equal(t, "http_400", w.Error.Code)

	done := b.start(t, ctx, "done", sagaOrder{Customer: "cus_1"})
	run, err := b.c.Why(ctx, done.ID)
	require.NoError(t, err)
	require.Nil(t, run.Blocked, "a finished run waits for nothing")

	// The list shows and filters by the same reason.
	timers, err := b.c.ListRuns(ctx, engine.ListParams{Blocked: engine.BlockedTimer})
	require.NoError(t, err)
	require.Len(t, timers, 1)
	require.Equal(t, nap.ID, timers[0].ID)
	require.Equal(t, engine.BlockedTimer, timers[0].Blocked.Reason)
	all, err := b.c.ListRuns(ctx, engine.ListParams{})
	require.NoError(t, err)
	for _, r := range all {
		require.Equal(t, r.Status.Finished(), r.Blocked == nil, "run %s", r.ID)
	}

	summary, err := b.c.BlockedSummary(ctx)
	require.NoError(t, err)
	require.Equal(t, map[engine.BlockedReason]int{
		engine.BlockedExecuting: 1, engine.BlockedCancelPending: 1, engine.BlockedDue: 1, engine.BlockedBackingOff: 1,
		engine.BlockedTimer: 1, engine.BlockedSignal: 3, engine.BlockedNeedsReconciliation: 1, engine.BlockedChild: 1,
		engine.BlockedCompensating: 1, engine.BlockedCompensationStuck: 1, engine.BlockedConcurrency: 1,
		engine.BlockedQueued: 1, engine.BlockedRateLimited: 1,
	}, summary.ByReason)
	require.Positive(t, summary.OldestDue)
	require.Equal(t, 2, summary.LongestStreak)
	require.Len(t, engine.BlockedReasons(), 14)
}

// The run gauges report what BlockedSummary counts.
func TestRunGaugesReportRunsByBlockedReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := observe(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "nap", func(ctx context.Context, _ struct{}) (string, error) {
		return "", engine.Sleep(ctx, "napped", time.Hour)
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{MeterProvider: o.mp, RunGauges: true})
	for _, key := range []string{"a", "b"} {
		_, err := c.Start(context.Background(), engine.StartParams{Workflow: "nap", IdempotencyKey: key, Input: []byte(`{}`)})
		require.NoError(t, err)
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, o.reader.Collect(context.Background(), &rm))
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "ratchet.runs.blocked" {
				for _, dp := range g.DataPoints {
					reason, _ := dp.Attributes.Value("ratchet.blocked_reason")
					got[reason.AsString()] = dp.Value
				}
			}
		}
	}
	require.Equal(t, int64(2), got["timer"])
	require.Equal(t, int64(0), got["due"])
	require.Len(t, got, len(engine.BlockedReasons()), "every reason is reported, zeros included")
}
