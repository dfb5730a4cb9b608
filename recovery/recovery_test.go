package recovery_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/testdb"
	"github.com/ratchet-run/ratchet/recovery"
)

// finishes reports every run whose execution ends finished, by id.
type finishes chan string

func (f finishes) Run(ctx context.Context, info engine.RunInfo) (context.Context, func(engine.RunEnd)) {
	return ctx, func(end engine.RunEnd) {
		if end.Status.Finished() {
			f <- info.RunID
		}
	}
}

func (finishes) Phase(ctx context.Context, _ engine.PhaseInfo) (context.Context, func(error)) {
	return ctx, func(error) {}
}

// await waits for n runs to finish, failing after a generous bound.
func (f finishes) await(t *testing.T, n int) map[string]bool {
	t.Helper()
	got := map[string]bool{}
	for len(got) < n {
		select {
		case id := <-f:
			got[id] = true
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d runs finished", len(got), n)
		}
	}
	return got
}

// startRecoverer runs a Recoverer until the test ends, stopping it as a
// worker would: no more polls, the engine shut down, executions awaited.
func startRecoverer(t *testing.T, c *engine.Client, cfg *recovery.Config) *recovery.Recoverer {
	t.Helper()
	r, err := recovery.New(c, cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() {
		r.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, c.Shutdown(ctx))
		require.NoError(t, r.Wait(ctx))
	})
	return r
}

func startTx(t *testing.T, pool *pgxpool.Pool, c *engine.Client, workflow string, keys ...string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, key := range keys {
			if _, err := c.StartTx(ctx, tx, engine.StartParams{Workflow: workflow, IdempotencyKey: key, Input: []byte(`{}`)}); err != nil {
				return err
			}
		}
		return nil
	}))
}

func TestRecovererFinishesRunsThatNobodyExecutes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t, nil)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "noop", func(ctx context.Context, _ struct{}) (int, error) {
		return engine.Atomic(ctx, "one", func(context.Context, pgx.Tx) (int, error) { return 1, nil }, nil)
	}, nil)
	require.NoError(t, err)
	done := finishes(make(chan string, 10))
	c, err := engine.NewClient(pool, &engine.Config{Workflows: workflows, Hooks: done})
	require.NoError(t, err)

	// A run created in a transaction, and one whose executor died: its
	// claim's lease (made by another client) has expired.
	startTx(t, pool, c, "noop", "crashed")
	dead, err := engine.NewClient(pool, &engine.Config{Workflows: workflows, ID: "dead"})
	require.NoError(t, err)
	claimed, err := dead.ClaimDue(ctx, 10) // and never continued
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	crashed := claimed[0]
	_, err = pool.Exec(ctx, `UPDATE ratchet.runs SET lease_expires_at = now() WHERE id = $1`, crashed.ID)
	require.NoError(t, err)
	startTx(t, pool, c, "noop", "created")

	startRecoverer(t, c, nil)
	got := done.await(t, 2)
	require.True(t, got[crashed.ID])
	run, err := c.GetRun(ctx, crashed.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	require.EqualValues(t, 2, run.LeaseToken, "taken over with a new token")
}

func TestRecovererRunsAtMostMaxExecutionsAndRefillsAsSlotsFree(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t, nil)
	workflows := engine.NewWorkflows()
	var (
		mu            sync.Mutex
		running, most int
		release       = make(chan struct{})
		started       = make(chan struct{}, 10)
	)
	_, err := engine.Register(workflows, "held", func(ctx context.Context, _ struct{}) (int, error) {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		started <- struct{}{}
		defer func() {
			mu.Lock()
			running--
			mu.Unlock()
		}()
		select {
		case <-release:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		return 1, nil
	}, nil)
	require.NoError(t, err)
	done := finishes(make(chan string, 10))
	c, err := engine.NewClient(pool, &engine.Config{Workflows: workflows, Hooks: done})
	require.NoError(t, err)
	keys := make([]string, 7)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	startTx(t, pool, c, "held", keys...)

	// A poll interval longer than the test: after the first poll, only a
	// freed slot can bring the remaining runs in.
	startRecoverer(t, c, &recovery.Config{MaxExecutions: 2, PollInterval: time.Minute})
	for range 2 {
		<-started
	}
	close(release)
	done.await(t, len(keys))
	require.Equal(t, 2, most, "never more than MaxExecutions at once")
}

func TestRecovererConfigIsValidated(t *testing.T) {
	t.Parallel()
	c, err := engine.NewClient(testdb.New(t, nil), &engine.Config{Workflows: engine.NewWorkflows()})
	require.NoError(t, err)
	for _, cfg := range []recovery.Config{{PollInterval: 2 * time.Minute}, {MaxExecutions: -1}, {ExecutionTimeout: time.Millisecond}} {
		_, err := recovery.New(c, &cfg)
		require.Error(t, err, "%+v", cfg)
	}
	_, err = recovery.New(nil, nil)
	require.Error(t, err)
}

func TestPruneDeletesExpiredFinishedRunsInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t, nil)
	workflows := engine.NewWorkflows()
	for name, r := range map[string]time.Duration{"24h": engine.Retention24h, "forever": engine.RetentionForever} {
		_, err := engine.Register(workflows, "wf-"+name, func(context.Context, struct{}) (int, error) { return 1, nil }, &engine.WorkflowOpts{Retention: r})
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

// Signals nobody consumed go after their retention; signals sent to or
// consumed by a run go with it.
func TestPruneDeletesUnconsumedSignalsPastTheirRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t, nil)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "quick", func(context.Context, struct{}) (int, error) { return 1, nil }, nil)
	require.NoError(t, err)
	c, err := engine.NewClient(pool, &engine.Config{Workflows: workflows})
	require.NoError(t, err)
	for _, p := range []engine.SignalParams{
		{Name: "never_awaited", EventID: "old", CorrelationKey: "k1", Retention: time.Microsecond},
		{Name: "never_awaited", EventID: "new", CorrelationKey: "k2"},
	} {
		p.Payload = []byte(`{}`)
		_, err := c.Signal(ctx, p)
		require.NoError(t, err)
	}
	startTx(t, pool, c, "quick", "run")
	run, err := c.ListRuns(ctx, engine.ListParams{})
	require.NoError(t, err)
	_, err = c.Signal(ctx, engine.SignalParams{Name: "s", EventID: "to-run", RunID: run[0].ID, Payload: []byte(`{}`)})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE ratchet.runs SET status = 'succeeded', finished_at = now(), expires_at = now() - interval '1 second'`)
	require.NoError(t, err)

	res, err := recovery.Prune(ctx, pool, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Deleted)
	require.EqualValues(t, 1, res.Signals, "the expired one; the run's went with it")
	var left []string
	rows, err := pool.Query(ctx, `SELECT event_id FROM ratchet.signals`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		left = append(left, id)
	}
	require.Equal(t, []string{"new"}, left)
}
