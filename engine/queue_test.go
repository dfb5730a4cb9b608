package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
)

// queued is a workflow of one phase that waits at a gate the test opens,
// counting the runs inside it.
type queued struct {
	gate    chan struct{}
	entered chan string // the run's key, as it enters
	mu      sync.Mutex
	inside  int
	most    int
}

func registerQueued(t *testing.T, workflows *engine.Workflows, name, queue string) *queued {
	t.Helper()
	q := &queued{gate: make(chan struct{}), entered: make(chan string, 100)}
	_, err := engine.Register(workflows, name, func(ctx context.Context, key string) (int, error) {
		return engine.Atomic(ctx, "held", func(ctx context.Context, tx pgx.Tx) (int, error) {
			q.mu.Lock()
			q.inside++
			q.most = max(q.most, q.inside)
			q.mu.Unlock()
			defer func() { q.mu.Lock(); q.inside--; q.mu.Unlock() }()
			q.entered <- key
			select {
			case <-q.gate:
				return bump(ctx, tx, key)
			case <-ctx.Done():
				return 0, context.Cause(ctx)
			}
		}, nil)
	}, &engine.WorkflowOpts{Queue: queue})
	require.NoError(t, err)
	return q
}

func startIn(t *testing.T, c *engine.Client, workflow, key string, priority int) *engine.Run {
	t.Helper()
	input, _ := json.Marshal(key)
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: workflow, IdempotencyKey: key, Input: input, StartOpts: engine.StartOpts{Priority: priority}})
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeCreated, res.Outcome)
	return res.Run
}

func claimedIDs(t *testing.T, c *engine.Client, limit int) []*engine.Run {
	t.Helper()
	runs, err := c.ClaimQueued(context.Background(), limit)
	require.NoError(t, err)
	return runs
}

func keysOf(runs []*engine.Run) []string {
	var out []string
	for _, r := range runs {
		out = append(out, r.IdempotencyKey)
	}
	return out
}

// A run in a queue is created waiting and executes nothing inline; the
// queue starts its runs highest priority first, then in creation order,
// never more executing than its concurrency.
func TestAQueueStartsItsRunsByPriorityThenCreationWithinItsConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	q := registerQueued(t, workflows, "mail", "outbound")
	c := b.client(t, workflows, &engine.Config{Queues: []engine.Queue{{Name: "outbound", Concurrency: 2}}})

	r1 := startIn(t, c, "mail", "m1", 0)
	require.Equal(t, engine.StatusPending, r1.Status, "not executed inline")
	require.Equal(t, engine.KindQueue, r1.WaitingFor.Kind)
	require.Equal(t, "outbound", *r1.Queue)
	startIn(t, c, "mail", "m2", 0)
	startIn(t, c, "mail", "m3", 5)
	r4 := startIn(t, c, "mail", "m4", 0)
	why, err := c.Why(ctx, r4.ID)
	require.NoError(t, err)
	require.Equal(t, engine.BlockedQueued, why.Blocked.Reason)
	require.Equal(t, "outbound", why.Blocked.Queue)
	require.Equal(t, 3, why.Blocked.QueueState.Ahead)

	first := claimedIDs(t, c, 10)
	require.Equal(t, []string{"m3", "m1"}, keysOf(first), "priority 5 first, then the oldest")
	require.Empty(t, claimedIDs(t, c, 10), "the queue's two are executing")
	why, err = c.Why(ctx, r4.ID)
	require.NoError(t, err)
	require.Equal(t, 2, why.Blocked.QueueState.Executing)
	require.Equal(t, 2, why.Blocked.QueueState.Concurrency)
	require.Equal(t, 1, why.Blocked.QueueState.Ahead)
	require.Contains(t, why.Blocked.Detail, "2 of its 2 running, 1 waiting ahead of this run")

	var wg sync.WaitGroup
	for _, run := range first {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = c.Continue(ctx, run) }()
	}
	require.ElementsMatch(t, []string{"m3", "m1"}, []string{receive(t, q.entered), receive(t, q.entered)})
	close(q.gate)
	wg.Wait()
	next := claimedIDs(t, c, 10)
	require.Equal(t, []string{"m2", "m4"}, keysOf(next))
	for _, run := range next {
		final, err := c.Continue(ctx, run)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, final.Status)
		require.NotNil(t, final.QueueStartedAt)
	}
	require.LessOrEqual(t, q.most, 2)
}

// A queue's rate limit counts starts in any window of its period, across
// clients; a run it holds back says until when.
func TestAQueuesRateLimitHoldsRunsBackAndSaysUntilWhen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	registerQueued(t, workflows, "charge", "gateway")
	queues := []engine.Queue{{Name: "gateway", Rate: engine.Rate{Limit: 2, Period: time.Hour}}}
	c1 := b.client(t, workflows, &engine.Config{Queues: queues})
	c2 := b.client(t, workflows, &engine.Config{Queues: queues})
	for i := range 3 {
		startIn(t, c1, "charge", fmt.Sprint("c", i), 0)
	}
	require.Equal(t, []string{"c0"}, keysOf(claimedIDs(t, c1, 1)))
	require.Equal(t, []string{"c1"}, keysOf(claimedIDs(t, c2, 10)), "one start left in the hour, whoever asks")
	require.Empty(t, claimedIDs(t, c1, 10))
	require.Empty(t, claimedIDs(t, c2, 10))

	why, err := c1.Why(ctx, b.runIDForKey(t, "c2"))
	require.NoError(t, err)
	require.Equal(t, engine.BlockedRateLimited, why.Blocked.Reason)
	require.NotNil(t, why.Blocked.Until)
	require.WithinDuration(t, time.Now().Add(time.Hour), *why.Blocked.Until, 10*time.Minute, "the first start leaves the window in an hour")
	require.Contains(t, why.Blocked.Detail, "the next start is at ")
	page, err := c1.ListRuns(ctx, engine.ListParams{Blocked: engine.BlockedRateLimited})
	require.NoError(t, err)
	require.Len(t, page, 1)
}

// PerProcess bounds what one client takes from a queue, not what the
// queue runs: a second client takes the next.
func TestAQueuesPerProcessBoundIsEachClients(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	q := registerQueued(t, workflows, "export", "exports")
	queues := []engine.Queue{{Name: "exports", PerProcess: 1}}
	c1 := b.client(t, workflows, &engine.Config{Queues: queues})
	c2 := b.client(t, workflows, &engine.Config{Queues: queues})
	for i := range 3 {
		startIn(t, c1, "export", fmt.Sprint("e", i), 0)
	}
	mine := claimedIDs(t, c1, 10)
	require.Len(t, mine, 1)
	require.Empty(t, claimedIDs(t, c1, 10), "c1 executes its one")
	require.Len(t, claimedIDs(t, c2, 10), 1)
	close(q.gate)
	final, err := c1.Continue(ctx, mine[0])
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, final.Status)
	require.Len(t, claimedIDs(t, c1, 10), 1, "its execution ended: c1 takes another")
}

// Only the queue starts a run: one taken over before it did goes back,
// not executed; one cancelled while waiting is cancelled at once.
func TestARunWaitingInItsQueueIsNeitherTakenOverNorLostToACancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	q := registerQueued(t, workflows, "report", "reports")
	c := b.client(t, workflows, &engine.Config{Queues: []engine.Queue{{Name: "reports"}}})
	run := startIn(t, c, "report", "r1", 0)
	back, err := c.TakeOver(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, back.Status)
	require.Equal(t, engine.KindQueue, back.WaitingFor.Kind)
	require.Nil(t, back.LeaseOwner)
	require.Empty(t, q.entered, "nothing executed")
	close(q.gate)
	claimed := claimedIDs(t, c, 10)
	require.Equal(t, []string{"r1"}, keysOf(claimed), "still the queue's to start")
	final, err := c.Continue(ctx, claimed[0])
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, final.Status)

	other := startIn(t, c, "report", "r2", 0)
	res, err := c.Cancel(ctx, other.ID)
	require.NoError(t, err)
	require.Equal(t, engine.CancelledNow, res.Outcome)
	require.Empty(t, claimedIDs(t, c, 10))
}

// Queues are checked where they are declared and where they are named:
// an unknown queue, a negative bound or a period without a limit never
// makes a run.
func TestQueueDeclarationsAndStartsAreChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, bad := range []engine.Queue{
		{Name: "q", Concurrency: -1},
		{Name: "q", PerProcess: -1},
		{Name: "q", Rate: engine.Rate{Limit: -1, Period: time.Second}},
		{Name: "q", Rate: engine.Rate{Limit: 5}},
		{Name: "q", Rate: engine.Rate{Period: time.Second}},
		{Name: "no spaces"},
	} {
		_, err := engine.NewClient(b.pool, &engine.Config{Workflows: engine.NewWorkflows(), Queues: []engine.Queue{bad}})
		require.Error(t, err, "%+v", bad)
	}
	_, err := engine.NewClient(b.pool, &engine.Config{Workflows: engine.NewWorkflows(), Queues: []engine.Queue{{Name: "q"}, {Name: "q"}}})
	require.ErrorContains(t, err, "declared twice")

	workflows := engine.NewWorkflows()
	registerQueued(t, workflows, "job", "jobs")
	_, err = engine.NewClient(b.pool, &engine.Config{Workflows: workflows})
	require.ErrorIs(t, err, engine.ErrUnknownQueue)

	plain := engine.NewWorkflows()
	_, err = engine.Register(plain, "plain", func(context.Context, string) (string, error) { return "ok", nil }, nil)
	require.NoError(t, err)
	_, err = engine.Register(plain, "bad-queue", func(context.Context, string) (string, error) { return "ok", nil }, &engine.WorkflowOpts{Queue: "not a name"})
	require.Error(t, err)
	c := b.client(t, plain, &engine.Config{Queues: []engine.Queue{{Name: "known"}}})
	_, err = c.Start(ctx, engine.StartParams{Workflow: "plain", IdempotencyKey: "k1", Input: []byte(`""`), StartOpts: engine.StartOpts{Queue: "unknown"}})
	require.ErrorIs(t, err, engine.ErrUnknownQueue)
	_, err = c.Start(ctx, engine.StartParams{Workflow: "plain", IdempotencyKey: "k2", Input: []byte(`""`), StartOpts: engine.StartOpts{Priority: 3}})
	require.ErrorIs(t, err, engine.ErrInvalidInput, "a priority without a queue")
	require.Zero(t, b.countRows(t, "runs"), "no run made")

	res, err := c.Start(ctx, engine.StartParams{Workflow: "plain", IdempotencyKey: "k3", Input: []byte(`""`), StartOpts: engine.StartOpts{Queue: "known", Priority: -2}})
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, res.Run.Status, "a start may put a run of any workflow in a queue")
	require.Equal(t, -2, res.Run.Priority)
}

// Many runs in one queue, worked by two clients' recoverers at once,
// never exceed its concurrency, and every one finishes.
func TestAQueuesConcurrencyHoldsAcrossRecoverers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	var mu sync.Mutex
	inside, most := 0, 0
	_, err := engine.Register(workflows, "sync", func(ctx context.Context, n int) (int, error) {
		return engine.Atomic(ctx, "held", func(ctx context.Context, tx pgx.Tx) (int, error) {
			mu.Lock()
			inside++
			most = max(most, inside)
			mu.Unlock()
			defer func() { mu.Lock(); inside--; mu.Unlock() }()
			// Long enough for the other clients to try.
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.005)`); err != nil {
				return 0, err
			}
			return bump(ctx, tx, "synced")
		}, nil)
	}, &engine.WorkflowOpts{Queue: "sync"})
	require.NoError(t, err)
	queues := []engine.Queue{{Name: "sync", Concurrency: 3}}
	clients := []*engine.Client{b.client(t, workflows, &engine.Config{Queues: queues}), b.client(t, workflows, &engine.Config{Queues: queues})}
	for _, c := range clients {
		startRecoverer(t, c)
	}
	const runs = 40
	for i := range runs {
		_, err := clients[i%2].Start(ctx, engine.StartParams{Workflow: "sync", IdempotencyKey: fmt.Sprint("s", i), Input: []byte(fmt.Sprint(i))})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return b.counter(t, "synced") == runs }, 60*time.Second, 20*time.Millisecond, "every run finishes")
	mu.Lock()
	defer mu.Unlock()
	require.LessOrEqual(t, most, 3, "the queue's concurrency is kept")
}

// The typed start takes every option Client.Start does (one StartOpts):
// a workflow that runs inline by default sends one run through a queue,
// with a priority.
func TestTheTypedStartChoosesAQueueAndPriority(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	wf, err := engine.Register(workflows, "charge", func(context.Context, struct{}) (int, error) { return 1, nil }, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{Queues: []engine.Queue{{Name: "gateway"}}})

	res, err := wf.Start(ctx, c, "inline", struct{}{}, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, res.Run.Status)
	res, err = wf.Start(ctx, c, "queued", struct{}{}, &engine.StartOpts{Queue: "gateway", Priority: 7})
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, res.Run.Status, "waiting in its queue")
	require.Equal(t, "gateway", *res.Run.Queue)
	require.Equal(t, 7, res.Run.Priority)
	_, err = wf.Start(ctx, c, "lost", struct{}{}, &engine.StartOpts{Queue: "nowhere"})
	require.ErrorIs(t, err, engine.ErrUnknownQueue)
}
