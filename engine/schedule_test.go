package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
)

// scheduled registers "report", which finishes at once, and "held", which
// awaits signal "done" (its runs stay unfinished).
func scheduledWorkflows(t *testing.T) *engine.Workflows {
	t.Helper()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "report", func(ctx context.Context, in struct{ Kind string }) (string, error) {
		return "reported " + in.Kind, nil
	}, nil)
	require.NoError(t, err)
	_, err = engine.Register(workflows, "held", func(ctx context.Context, _ struct{}) (string, error) {
		return engine.Await[string](ctx, "done", nil)
	}, nil)
	require.NoError(t, err)
	return workflows
}

// monthly puts a schedule ticking at midnight UTC on the first of each
// month and moves its next tick five months back: six ticks are due (the
// five past months' and this month's), all missed.
func (b *testBundle) monthly(t *testing.T, c *engine.Client, s engine.Schedule) {
	t.Helper()
	s.Cron = "0 0 1 * *"
	_, err := c.PutSchedule(context.Background(), s)
	require.NoError(t, err)
	_, err = b.pool.Exec(context.Background(), `UPDATE ratchet.schedules SET next_tick_at = date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - interval '5 months' WHERE name = $1`, s.Name)
	require.NoError(t, err)
}

func (b *testBundle) scheduleRuns(t *testing.T, name string) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT idempotency_key FROM ratchet.runs WHERE idempotency_key LIKE $1 ORDER BY idempotency_key`, "schedule/"+name+"/%")
	require.NoError(t, err)
	var keys []string
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		keys = append(keys, k)
	}
	require.NoError(t, rows.Err())
	return keys
}

// Two clients ticking at once start each tick once: six due ticks, six
// runs, keyed by the schedule and the tick.
func TestEachTickStartsOneRunWhicheverClientTicksIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := scheduledWorkflows(t)
	c1, c2 := b.client(t, workflows, nil), b.client(t, workflows, nil)
	b.monthly(t, c1, engine.Schedule{Name: "monthly", Workflow: "report", Input: []byte(`{"Kind": "monthly"}`), CatchUp: engine.CatchUpAll, Overlap: engine.OverlapAllow})

	var wg sync.WaitGroup
	counts := make([]int, 2)
	for i, c := range []*engine.Client{c1, c2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, _, err := c.TickSchedules(ctx)
			if err == nil {
				counts[i] = n
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 6, counts[0]+counts[1], "six ticks, six runs, between them")
	keys := b.scheduleRuns(t, "monthly")
	require.Len(t, keys, 6)
	first := time.Now().UTC().AddDate(0, -5, 0)
	require.Equal(t, fmt.Sprintf("schedule/monthly/%04d-%02d-01T00:00:00Z", first.Year(), first.Month()), keys[0])

	n, next, err := c1.TickSchedules(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing more is due")
	nextMonth := time.Now().UTC().AddDate(0, 1, 0)
	require.Equal(t, time.Date(nextMonth.Year(), nextMonth.Month(), 1, 0, 0, 0, 0, time.UTC), next.UTC())
	s, err := c1.GetSchedule(ctx, "", "monthly")
	require.NoError(t, err)
	require.Equal(t, int64(6), s.Started)
	require.NotNil(t, s.LastRunID)
	run, err := c1.GetRun(ctx, *s.LastRunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, run.Status, "started for a worker to execute")
}

// What becomes of missed ticks: skip starts none, one the latest, all
// every one.
func TestCatchUpPoliciesDecideWhatMissedTicksStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.client(t, scheduledWorkflows(t), nil)
	for _, p := range []struct {
		catchUp          engine.CatchUp
		started, skipped int64
	}{{engine.CatchUpSkip, 0, 6}, {engine.CatchUpOne, 1, 5}, {engine.CatchUpAll, 6, 0}} {
		b.monthly(t, c, engine.Schedule{Name: "catch-" + string(p.catchUp), Workflow: "report", CatchUp: p.catchUp, Overlap: engine.OverlapAllow})
	}
	n, _, err := c.TickSchedules(ctx)
	require.NoError(t, err)
	require.Equal(t, 7, n)
	schedules, err := c.ListSchedules(ctx, "")
	require.NoError(t, err)
	require.Len(t, schedules, 3)
	for i, want := range []struct {
		catchUp          engine.CatchUp
		started, skipped int64
	}{{engine.CatchUpAll, 6, 0}, {engine.CatchUpOne, 1, 5}, {engine.CatchUpSkip, 0, 6}} {
		s := schedules[i]
		require.Equal(t, "catch-"+string(want.catchUp), s.Name)
		require.Equal(t, want.started, s.Started, s.Name)
		require.Equal(t, want.skipped, s.Skipped, s.Name)
		require.Len(t, b.scheduleRuns(t, s.Name), int(want.started))
	}
	this := time.Now().UTC()
	require.Equal(t, []string{fmt.Sprintf("schedule/catch-one/%04d-%02d-01T00:00:00Z", this.Year(), this.Month())}, b.scheduleRuns(t, "catch-one"), "the latest")
}

// A tick while the schedule's last run is unfinished: skip starts none,
// buffer starts it queued behind the last, allow starts it beside.
func TestOverlapPoliciesDecideWhatATickDoesWhileTheLastRunIsUnfinished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.client(t, scheduledWorkflows(t), nil)
	for _, o := range []engine.Overlap{engine.OverlapSkip, engine.OverlapBuffer, engine.OverlapAllow} {
		b.monthly(t, c, engine.Schedule{Name: "overlap-" + string(o), Workflow: "held", CatchUp: engine.CatchUpAll, Overlap: o})
	}
	_, _, err := c.TickSchedules(ctx)
	require.NoError(t, err)
	require.Len(t, b.scheduleRuns(t, "overlap-skip"), 1, "the first; the rest overlapped it")
	require.Len(t, b.scheduleRuns(t, "overlap-allow"), 6)
	buffered := b.scheduleRuns(t, "overlap-buffer")
	require.Len(t, buffered, 6)
	// A worker executes them one at a time, in tick order.
	for i, key := range buffered {
		run, err := c.TakeOver(ctx, b.runIDForKey(t, key))
		require.NoError(t, err)
		if i == 0 {
			require.Equal(t, engine.StatusWaiting, run.Status, "the first awaits its signal, holding the slot")
			require.True(t, run.HoldsSlot)
		} else {
			require.Equal(t, engine.StatusPending, run.Status, "tick %d queued behind the first", i)
			require.Equal(t, engine.KindConcurrency, run.WaitingFor.Kind)
		}
	}
	s, err := c.GetSchedule(ctx, "", "overlap-skip")
	require.NoError(t, err)
	require.Equal(t, int64(5), s.Skipped)
}

// A paused schedule ticks no more; resumed, its missed ticks go by its
// catch-up policy. A trigger starts a run now, once per key.
func TestPauseResumeAndTrigger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.client(t, scheduledWorkflows(t), nil)
	b.monthly(t, c, engine.Schedule{Name: "nightly", Workflow: "report", Input: []byte(`{"Kind": "nightly"}`)})
	paused, err := c.PauseSchedule(ctx, "", "nightly", true)
	require.NoError(t, err)
	require.True(t, paused.Paused)
	n, _, err := c.TickSchedules(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "paused")

	res, err := c.TriggerSchedule(ctx, "", "nightly", "ops-1")
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeCreated, res.Outcome)
	require.Equal(t, engine.StatusSucceeded, res.Run.Status, "executed as Start does")
	require.Equal(t, json.RawMessage(`"reported nightly"`), res.Run.Output)
	again, err := c.TriggerSchedule(ctx, "", "nightly", "ops-1")
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeFinished, again.Outcome, "the same trigger, retried")
	require.Equal(t, res.Run.ID, again.Run.ID)

	_, err = c.PauseSchedule(ctx, "", "nightly", false)
	require.NoError(t, err)
	n, _, err = c.TickSchedules(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "catch-up one: the latest missed tick")

	_, err = c.PauseSchedule(ctx, "", "nope", true)
	require.ErrorIs(t, err, engine.ErrScheduleNotFound)
	_, err = c.TriggerSchedule(ctx, "", "nope", "k")
	require.ErrorIs(t, err, engine.ErrScheduleNotFound)
	require.NoError(t, c.DeleteSchedule(ctx, "", "nightly"))
	require.ErrorIs(t, c.DeleteSchedule(ctx, "", "nightly"), engine.ErrScheduleNotFound)
}

// Bad declarations are refused where they are made and store nothing.
func TestBadSchedulesAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := scheduledWorkflows(t)
	c := b.client(t, workflows, nil)
	for _, bad := range []engine.Schedule{
		{Name: "s", Workflow: "report", Cron: "61 * * * *"},
		{Name: "s", Workflow: "report", Cron: "0 0 * * *", TimeZone: "Mars/Olympus"},
		{Name: "s", Workflow: "report"},
		{Name: "s", Workflow: "report", Cron: "0 0 * * *", Every: time.Hour},
		{Name: "s", Workflow: "report", Every: 1500 * time.Millisecond},
		{Name: "s", Workflow: "report", Every: time.Hour, TimeZone: "Europe/Paris"},
		{Name: "s", Workflow: "report", Every: time.Hour, CatchUp: "some"},
		{Name: "s", Workflow: "report", Every: time.Hour, Overlap: "queue"},
		{Name: "s", Workflow: "missing", Every: time.Hour},
		{Name: "s", Workflow: "report", Every: time.Hour, Input: []byte(`[1, 2]`)},
		{Name: "s", Workflow: "report", Every: time.Hour, Input: []byte(`{`)},
		{Name: "no spaces", Workflow: "report", Every: time.Hour},
	} {
		_, err := c.PutSchedule(ctx, bad)
		require.ErrorIs(t, err, engine.ErrInvalidSchedule, "%+v", bad)
	}
	_, err := engine.NewClient(b.pool, &engine.Config{Workflows: workflows, Schedules: []engine.Schedule{{Name: "s", Workflow: "report", Cron: "not cron"}}})
	require.ErrorIs(t, err, engine.ErrInvalidSchedule)
	_, err = engine.NewClient(b.pool, &engine.Config{Workflows: workflows, Schedules: []engine.Schedule{{Name: "s", Workflow: "missing", Every: time.Hour}}})
	require.ErrorIs(t, err, engine.ErrInvalidSchedule)
	all, err := c.ListSchedules(ctx, "")
	require.NoError(t, err)
	require.Empty(t, all)
}

// A schedule declared in code is put as the worker starts, and its ticks'
// runs are started and executed by recoverers: an interval schedule of a
// second, left to run a few seconds, has one run per tick, each
// succeeded.
func TestARecovererDeclaresTicksAndExecutesSchedules(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.client(t, scheduledWorkflows(t), &engine.Config{Schedules: []engine.Schedule{
		{Name: "every-second", Workflow: "report", Every: time.Second, CatchUp: engine.CatchUpAll, Overlap: engine.OverlapAllow},
	}})
	startRecoverer(t, c)
	require.Eventually(t, func() bool {
		var n int
		return b.pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs WHERE idempotency_key LIKE 'schedule/every-second/%' AND status = 'succeeded'`).Scan(&n) == nil && n >= 3
	}, 60*time.Second, 20*time.Millisecond, "three ticks' runs executed")
	s, err := c.GetSchedule(ctx, "", "every-second")
	require.NoError(t, err)
	require.Equal(t, "code", s.Source)
	keys := b.scheduleRuns(t, "every-second")
	for i := 1; i < len(keys); i++ {
		prev, err := time.Parse(time.RFC3339, keys[i-1][len("schedule/every-second/"):])
		require.NoError(t, err)
		cur, err := time.Parse(time.RFC3339, keys[i][len("schedule/every-second/"):])
		require.NoError(t, err)
		require.Equal(t, time.Second, cur.Sub(prev), "no tick skipped or doubled: %v", keys)
	}
}
