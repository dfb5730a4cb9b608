package recovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/testdb"
	"github.com/ratchet-run/ratchet/recovery"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	state := func(status engine.Status, token int64, live bool, expires, next *time.Time) *engine.RunState {
		return &engine.RunState{
			Run:       engine.Run{Status: status, LeaseToken: token, LeaseExpiresAt: expires, NextAttemptAt: next},
			LeaseLive: live, Now: now,
		}
	}
	for _, tc := range []struct {
		name  string
		state *engine.RunState
		want  recovery.Decision
	}{
		{"finished", state(engine.StatusSucceeded, 3, false, nil, nil), recovery.Decision{Action: recovery.Done, Reason: "run finished"}},
		{"failed", state(engine.StatusFailed, 3, false, nil, nil), recovery.Decision{Action: recovery.Done, Reason: "run finished"}},
		{"newer claim", state(engine.StatusRunning, 4, true, at(time.Second), nil), recovery.Decision{Action: recovery.Done, Reason: "lease replaced by a newer claim"}},
		{"live lease", state(engine.StatusRunning, 3, true, at(5*time.Second), nil), recovery.Decision{Action: recovery.Wait, Until: now.Add(5 * time.Second), Reason: "lease is live"}},
		{"retry not due", state(engine.StatusPending, 3, false, nil, at(time.Minute)), recovery.Decision{Action: recovery.Wait, Until: now.Add(time.Minute), Reason: "retry not yet due"}},
		{"expired lease", state(engine.StatusRunning, 3, false, at(-time.Second), nil), recovery.Decision{Action: recovery.TakeOver, Reason: "lease absent or expired"}},
		{"retry due", state(engine.StatusPending, 3, false, nil, at(-time.Millisecond)), recovery.Decision{Action: recovery.TakeOver, Reason: "lease absent or expired"}},
		{"never claimed", state(engine.StatusPending, 3, false, nil, nil), recovery.Decision{Action: recovery.TakeOver, Reason: "lease absent or expired"}},
	} {
		require.Equal(t, tc.want, recovery.Decide(tc.state, 3), tc.name)
	}
}

func TestPruneDeletesExpiredFinishedRunsInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t, nil)
	workflows := engine.NewWorkflows()
	for _, r := range []engine.Retention{engine.Retention24h, engine.RetentionForever} {
		_, err := engine.Register(workflows, "wf-"+string(r), func(context.Context, struct{}) (int, error) { return 1, nil }, &engine.WorkflowOpts{Retention: r})
		require.NoError(t, err)
	}
	_, err := engine.Register(workflows, "stuck", func(context.Context, struct{}) (int, error) { return 0, context.Canceled }, nil)
	require.NoError(t, err)
	c, err := engine.NewClient(pool, &engine.Config{Workflows: workflows})
	require.NoError(t, err)
	start := func(wf, key string) *engine.Run {
		res, _ := c.Start(ctx, engine.StartParams{Workflow: wf, IdempotencyKey: key, Input: []byte(`{}`)})
		require.NotNil(t, res)
		return res.Run
	}
	for i := range 5 {
		start("wf-24h", "expired-"+string(rune('a'+i)))
	}
	fresh := start("wf-24h", "fresh")
	for i := range 2 {
		start("wf-forever", "forever-"+string(rune('a'+i)))
	}
	start("stuck", "unfinished") // abandoned: unfinished, no expiry
	// Five runs finished over a day ago.
	_, err = pool.Exec(ctx, `UPDATE ratchet.runs SET expires_at = now() - interval '1 second' WHERE idempotency_key LIKE 'expired-%'`)
	require.NoError(t, err)

	res, err := recovery.Prune(ctx, pool, &recovery.PruneOpts{BatchSize: 2})
	require.NoError(t, err)
	require.Equal(t, recovery.PruneResult{Deleted: 5, Batches: 3}, res, "two full batches and a short one")

	var left []string
	rows, err := pool.Query(ctx, `SELECT idempotency_key FROM ratchet.runs ORDER BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		left = append(left, k)
	}
	require.Equal(t, []string{"forever-a", "forever-b", "fresh", "unfinished"}, left)
	require.NotNil(t, fresh.ExpiresAt)

	again := start("wf-24h", "expired-a")
	require.NotNil(t, again)
	res2, err := c.Start(ctx, engine.StartParams{Workflow: "wf-24h", IdempotencyKey: "expired-b", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeCreated, res2.Outcome, "a key reused after pruning is a new run")
}
