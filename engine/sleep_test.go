package engine_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/recovery"
)

// registerSleeper registers "sleeper": phase "before", a sleep "cool" of
// the input's duration, phase "after" (which bumps counter "after").
func registerSleeper(t *testing.T, workflows *engine.Workflows) {
	t.Helper()
	_, err := engine.Register(workflows, "sleeper", func(ctx context.Context, d time.Duration) (int, error) {
		if _, err := engine.Atomic(ctx, "before", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "before") }, nil); err != nil {
			return 0, err
		}
		if err := engine.Sleep(ctx, "cool", d); err != nil {
			return 0, err
		}
		return engine.Atomic(ctx, "after", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "after") }, nil)
	}, nil)
	require.NoError(t, err)
}

func startSleeper(t *testing.T, c *engine.Client, key string, d time.Duration) *engine.Run {
	t.Helper()
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: "sleeper", IdempotencyKey: key, Input: []byte(strconv.FormatInt(int64(d), 10))})
	require.NoError(t, err)
	return res.Run
}

func TestSleepParksTheRunHoldingNothingAndWakesItAtItsTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	registerSleeper(t, workflows)
	ends := make(runEnds, 10)
	c := b.client(t, workflows, &engine.Config{Hooks: ends})

	const d = 400 * time.Millisecond
	run := startSleeper(t, c, "k", d)
	require.Equal(t, engine.StatusWaiting, run.Status)
	require.Equal(t, engine.StatusWaiting, receive(t, ends).Status, "the execution ended")
	require.Nil(t, run.LeaseOwner, "nothing holds it")
	require.NotNil(t, run.WaitingFor)
	require.Equal(t, engine.Wait{Kind: engine.KindSleep, Phase: "cool", Seq: 1, Until: run.WaitingFor.Until}, *run.WaitingFor)
	until := *run.WaitingFor.Until
	require.True(t, until.Equal(*run.DueAt), "due when it wakes")
	require.InDelta(t, d.Seconds(), until.Sub(run.UpdatedAt).Seconds(), 0.05, "the wake time is the database's now() + d")
	require.Equal(t, "before", run.RecoveryPoint)

	// Taken over early, it parks again until the same time: the wake time
	// is fixed when it first parks.
	again, err := c.TakeOver(ctx, run.ID)
	require.NoError(t, err)
	receive(t, ends)
	require.Equal(t, engine.StatusWaiting, again.Status)
	require.True(t, until.Equal(*again.WaitingFor.Until))
	require.Equal(t, 1, b.counter(t, "before"), "committed phases are not repeated")

	// A recoverer wakes it at its time.
	r, err := recovery.New(c, &recovery.Config{PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { r.Stop(); _ = r.Wait(ctx) })
	require.Equal(t, engine.StatusSucceeded, receive(t, ends).Status)
	done, err := c.GetRun(ctx, run.ID)
	require.NoError(t, err)
	require.False(t, done.FinishedAt.Before(until), "not before its time")
	require.Nil(t, done.WaitingFor, "the wait is over")
	journal := enginetest.RequirePhases(t, c, run.ID, "before", "cool", "after")
	require.Equal(t, engine.KindSleep, journal[1].Kind)
	require.JSONEq(t, `{"until":"`+until.UTC().Format(time.RFC3339Nano)+`"}`, string(journal[1].Output))
	require.Equal(t, 1, b.counter(t, "before"))
	require.Equal(t, 1, b.counter(t, "after"))
}

func TestSleepOfNothingCommitsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	registerSleeper(t, workflows)
	c := b.client(t, workflows, nil)
	run := startSleeper(t, c, "zero", 0)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	enginetest.RequirePhases(t, c, run.ID, "before", "cool", "after")
	run = startSleeper(t, c, "negative", -time.Hour)
	require.Equal(t, engine.StatusSucceeded, run.Status)
}

func TestSleepUntilATimeFromTheInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	wf, err := engine.Register(workflows, "dunning", func(ctx context.Context, at time.Time) (string, error) {
		if err := engine.SleepUntil(ctx, "until_retry_day", at); err != nil {
			return "", err
		}
		return "retried", nil
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)

	tomorrow := time.Now().Add(24 * time.Hour).UTC().Truncate(time.Microsecond)
	res, err := wf.Start(ctx, c, "later", tomorrow, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, res.Run.Status)
	require.True(t, tomorrow.Equal(*res.Run.WaitingFor.Until))
	require.True(t, tomorrow.Equal(*res.Run.DueAt))

	past, err := wf.Start(ctx, c, "past", time.Now().Add(-time.Minute), nil)
	require.NoError(t, err)
	require.Equal(t, "retried", past.Output)

	// A waiting run is cancelled at once: nothing holds it.
	cancelled, err := c.Cancel(ctx, res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.CancelledNow, cancelled.Outcome)
	require.Equal(t, engine.StatusCancelled, cancelled.Run.Status)
}

// A workflow that ignores the park and calls on is stopped at its next
// phase: the run stays parked, nothing more is written.
func TestAParkedExecutionRunsNothingMore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	var after error
	_, err := engine.Register(workflows, "careless", func(ctx context.Context, _ struct{}) (int, error) {
		_ = engine.Sleep(ctx, "nap", time.Hour) // wrongly ignored
		_, after = engine.Atomic(ctx, "more", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "more") }, nil)
		return 1, nil
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: "careless", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, res.Run.Status)
	require.Error(t, after, "the phase after a park refuses to run")
	require.Equal(t, 0, b.counter(t, "more"))
	enginetest.RequirePhases(t, c, res.Run.ID)
}

// A process that dies right after a woken run commits its sleep: the run
// finishes once, its phases each committed once.
func TestACrashAfterWakingFinishesTheRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	registerSleeper(t, workflows)
	c := b.client(t, workflows, nil)
	run := startSleeper(t, c, "k", time.Millisecond)
	require.Equal(t, engine.StatusWaiting, run.Status)

	// Woken (its millisecond has passed by the time the claim runs), and
	// the process dies as the sleep commits.
	_, err := c.TakeOver(enginetest.CrashAfter(ctx, "cool"), run.ID)
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	successor := b.client(t, workflows, nil)
	_, err = successor.TakeOver(ctx, run.ID)
	require.ErrorIs(t, err, engine.ErrLeaseHeld, "the dead executor's lease is live")
	b.expireLease(t, run.ID)
	done, err := successor.TakeOver(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, done.Status)
	enginetest.RequirePhases(t, successor, run.ID, "before", "cool", "after")
	require.Equal(t, 1, b.counter(t, "before"))
	require.Equal(t, 1, b.counter(t, "after"))
}

// A waiting run's trace shows the wait: the parking execution's phase span
// carries a ratchet.wait event with the wake time (not an error), and the
// execution that wakes it links to the request's trace.
func TestAWaitIsAnEventOfItsPhaseSpanAndTheWakingExecutionLinksBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := observe(t)
	workflows := engine.NewWorkflows()
	registerSleeper(t, workflows)
	c := b.client(t, workflows, &engine.Config{TracerProvider: o.tp, MeterProvider: o.mp})

	ctx, request := o.tp.Tracer("test").Start(context.Background(), "POST /payouts")
	res, err := c.Start(ctx, engine.StartParams{Workflow: "sleeper", IdempotencyKey: "k", Input: []byte(strconv.FormatInt(int64(time.Millisecond), 10))})
	request.End()
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, res.Run.Status)
	parking := o.span(t, "ratchet.phase cool")
	require.Equal(t, codes.Unset, parking.Status().Code, "a wait is not an error")
	require.Len(t, parking.Events(), 1)
	ev := parking.Events()[0]
	require.Equal(t, "ratchet.wait", ev.Name)
	evAttrs := map[attribute.Key]attribute.Value{}
	for _, kv := range ev.Attributes {
		evAttrs[kv.Key] = kv.Value
	}
	require.Equal(t, "sleep", evAttrs["ratchet.wait.kind"].AsString())
	require.Equal(t, res.Run.WaitingFor.Until.UTC().Format(time.RFC3339Nano), evAttrs["ratchet.wait.until"].AsString())

	// Woken in a worker's trace (its millisecond is over by now).
	jobCtx, job := o.tp.Tracer("test").Start(context.Background(), "recoverer")
	run, err := c.TakeOver(jobCtx, res.Run.ID)
	job.End()
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	var woken sdktrace.ReadOnlySpan
	for _, s := range o.spans.Ended() {
		if s.Name() == "ratchet.run sleeper" && s.SpanContext().TraceID() == job.SpanContext().TraceID() {
			woken = s
		}
	}
	require.NotNil(t, woken)
	require.Len(t, woken.Links(), 1)
	require.Equal(t, request.SpanContext().TraceID(), woken.Links()[0].SpanContext.TraceID(), "linked to the request that began it")
	require.EqualValues(t, 1, o.sum(t, "ratchet.runs.woken", attribute.String("ratchet.wait.kind", "sleep")))
	require.Zero(t, o.sum(t, "ratchet.lease.takeovers"), "a wake is not a takeover")
}
