package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/recovery"
)

// keyedOrder is the input of the limited workflows: Customer keys it, Await
// makes it await signal "go" before its gated phase.
type keyedOrder struct {
	Customer string `json:"customer"`
	N        int    `json:"n"`
	Await    bool   `json:"await,omitempty"`
}

// limited is a workflow whose runs enter a gated phase ("held"), reporting
// which run entered, and wait there for a token of their customer's gate.
// It measures how many runs of each customer are inside at once.
type limited struct {
	entered chan keyedOrder
	mu      sync.Mutex
	gates   map[string]chan struct{}
	inside  map[string]int
	most    map[string]int // the most runs of a customer inside at once
	overlap int            // the most runs of any customers inside at once
}

func registerLimited(t *testing.T, workflows *engine.Workflows, name string, conc *engine.Concurrency) *limited {
	t.Helper()
	l := &limited{entered: make(chan keyedOrder, 100), gates: map[string]chan struct{}{}, inside: map[string]int{}, most: map[string]int{}}
	_, err := engine.Register(workflows, name, func(ctx context.Context, in keyedOrder) (int, error) {
		if in.Await {
			if _, err := engine.Await[json.RawMessage](ctx, "go", nil); err != nil {
				return 0, err
			}
		}
		return engine.Atomic(ctx, "held", func(ctx context.Context, tx pgx.Tx) (int, error) {
			gate := l.enter(in)
			defer l.leave(in)
			select {
			case <-gate:
				return bump(ctx, tx, in.Customer)
			case <-ctx.Done():
				return 0, context.Cause(ctx)
			}
		}, nil)
	}, &engine.WorkflowOpts{Concurrency: conc})
	require.NoError(t, err)
	return l
}

func (l *limited) gate(customer string) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	g, ok := l.gates[customer]
	if !ok {
		g = make(chan struct{})
		l.gates[customer] = g
	}
	return g
}

func (l *limited) enter(in keyedOrder) chan struct{} {
	g := l.gate(in.Customer)
	l.mu.Lock()
	l.inside[in.Customer]++
	l.most[in.Customer] = max(l.most[in.Customer], l.inside[in.Customer])
	total := 0
	for _, n := range l.inside {
		total += n
	}
	l.overlap = max(l.overlap, total)
	l.mu.Unlock()
	l.entered <- in
	return g
}

func (l *limited) leave(in keyedOrder) {
	l.mu.Lock()
	l.inside[in.Customer]--
	l.mu.Unlock()
}

// release lets one run of the customer out of the gated phase.
func (l *limited) release(t *testing.T, customer string) {
	t.Helper()
	select {
	case l.gate(customer) <- struct{}{}:
	case <-time.After(30 * time.Second):
		t.Fatalf("no run of %s was in the gated phase", customer)
	}
}

func (l *limited) mostInside(customer string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.most[customer]
}

// startOrder starts a run of workflow for customer's keyedOrder n, waiting
// for its inline execution as wait says.
func startOrder(t *testing.T, c *engine.Client, workflow string, in keyedOrder, wait time.Duration, limit int) *engine.Run {
	t.Helper()
	input, err := json.Marshal(in)
	require.NoError(t, err)
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: workflow, IdempotencyKey: fmt.Sprintf("%s-%d", in.Customer, in.N),
		Input:     input,
		StartOpts: engine.StartOpts{Wait: wait, ConcurrencyLimit: limit},
	})
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeCreated, res.Outcome)
	return res.Run
}

// requireQueued checks that the run waits for a slot of key, held by the
// runs holders.
func requireQueued(t *testing.T, c *engine.Client, runID, key string, limit int, holders ...string) {
	t.Helper()
	run, err := c.Why(context.Background(), runID)
	require.NoError(t, err)
	require.NotNil(t, run.Blocked, "run %s (%s) is blocked", runID, run.Status)
	require.Equal(t, engine.BlockedConcurrency, run.Blocked.Reason)
	require.Equal(t, key, run.Blocked.ConcurrencyKey)
	require.Equal(t, limit, run.Blocked.Limit)
	if len(holders) == 0 {
		require.Empty(t, run.Blocked.Holders)
	} else {
		require.Equal(t, holders, run.Blocked.Holders)
	}
	require.Contains(t, run.Blocked.Detail, key)
	require.False(t, run.HoldsSlot)
	require.Nil(t, run.LeaseOwner, "a queued run is leased to nobody")
	require.Nil(t, run.DueAt, "a queued run is not due: no poll claims it")
}

// requireDue checks that a slot passed to the run: it is due (for any
// worker serving it), no longer queued.
func requireDue(t *testing.T, c *engine.Client, runID, msg string) {
	t.Helper()
	run, err := c.Why(context.Background(), runID)
	require.NoError(t, err)
	require.NotNil(t, run.Blocked)
	require.Contains(t, []engine.BlockedReason{engine.BlockedDue, engine.BlockedUnserved}, run.Blocked.Reason, msg)
	require.NotNil(t, run.DueAt, msg)
	require.Nil(t, run.WaitingFor, msg)
}

// startRecoverer runs a worker's recovery loop over c for the test.
func startRecoverer(t *testing.T, c *engine.Client) {
	t.Helper()
	ctx := context.Background()
	r, err := recovery.New(c, &recovery.Config{PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { r.Stop(); _ = r.Wait(ctx) })
}

// eventuallySucceeds waits for the run to succeed, for a generous bound.
func eventuallySucceeds(t *testing.T, c *engine.Client, runID string) *engine.Run {
	t.Helper()
	var run *engine.Run
	require.Eventually(t, func() bool {
		got, err := c.GetRun(context.Background(), runID)
		run = got
		return err == nil && got.Status == engine.StatusSucceeded
	}, 30*time.Second, 10*time.Millisecond, "run %s succeeds", runID)
	return run
}

// A key's runs execute one at a time (the declared limit), queued, never
// refused, and in the keyedOrder they were created; another key's runs go on
// meanwhile, and a start's limit overrides the declaration's.
func TestConcurrencyLimitsAKeysRunsAndStartsThemInCreationOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	l := registerLimited(t, workflows, "refund", &engine.Concurrency{Key: "customer", Limit: 1})
	c := b.client(t, workflows, &engine.Config{StaleAfter: time.Minute})

	first := startOrder(t, c, "refund", keyedOrder{Customer: "alice", N: 0}, -1, 0)
	require.Equal(t, keyedOrder{Customer: "alice", N: 0}, receive(t, l.entered))
	got, err := c.GetRun(context.Background(), first.ID)
	require.NoError(t, err)
	require.True(t, got.HoldsSlot)
	require.Equal(t, "refund/alice", *got.ConcurrencyKey)
	require.Equal(t, 1, *got.ConcurrencyLimit)

	queued := []*engine.Run{}
	for n := 1; n <= 4; n++ {
		run := startOrder(t, c, "refund", keyedOrder{Customer: "alice", N: n}, 0, 0)
		require.Equal(t, engine.StatusPending, run.Status, "created and queued, not refused")
		require.NotNil(t, run.WaitingFor)
		require.Equal(t, engine.KindConcurrency, run.WaitingFor.Kind)
		requireQueued(t, c, run.ID, "refund/alice", 1, first.ID)
		queued = append(queued, run)
	}
	// Another key is not held up; its start says limit 2.
	for n := range 2 {
		startOrder(t, c, "refund", keyedOrder{Customer: "bob", N: n}, -1, 2)
	}
	require.ElementsMatch(t, []keyedOrder{{Customer: "bob", N: 0}, {Customer: "bob", N: 1}}, []keyedOrder{receive(t, l.entered), receive(t, l.entered)})
	bob := startOrder(t, c, "refund", keyedOrder{Customer: "bob", N: 2}, 0, 2)
	requireQueued(t, c, bob.ID, "refund/bob", 2, b.runIDForKey(t, "bob-0"), b.runIDForKey(t, "bob-1"))

	startRecoverer(t, c)
	for n := 1; n <= 4; n++ {
		l.release(t, "alice")
		require.Equal(t, keyedOrder{Customer: "alice", N: n}, receive(t, l.entered), "the oldest queued run takes the slot")
	}
	l.release(t, "alice")
	for range 3 {
		l.release(t, "bob")
	}
	for _, run := range append(queued, first, bob) {
		require.False(t, eventuallySucceeds(t, c, run.ID).HoldsSlot, "given up as it finished")
	}
	require.Equal(t, 1, l.mostInside("alice"), "never two of alice's runs at once")
	require.Equal(t, 2, l.mostInside("bob"), "bob's two slots both used")
	require.GreaterOrEqual(t, l.overlap, 3, "alice's and bob's runs executed side by side")
	require.Equal(t, 5, b.counter(t, "alice"))
	require.Equal(t, 3, b.counter(t, "bob"))
}

// A parked run keeps its slot by default: the next run of its key waits
// for it. Declared ReleaseWhileParked, it gives the slot up while it
// waits, and queues for one again when it wakes.
func TestAParkedRunKeepsItsSlotUnlessItReleasesItWhileParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	keeps := registerLimited(t, workflows, "keeps", &engine.Concurrency{Limit: 1})
	releases := registerLimited(t, workflows, "releases", &engine.Concurrency{Limit: 1, ReleaseWhileParked: true})
	c := b.client(t, workflows, &engine.Config{StaleAfter: time.Minute})
	startRecoverer(t, c)
	signal := func(runID string) {
		t.Helper()
		_, err := c.Signal(ctx, engine.SignalParams{Name: "go", EventID: "go-" + runID, RunID: runID, Payload: []byte(`{}`)})
		require.NoError(t, err)
	}

	// Kept: the awaiting run holds the slot; the next waits for it.
	parked := startOrder(t, c, "keeps", keyedOrder{Customer: "k", N: 0, Await: true}, 0, 0)
	require.Equal(t, engine.StatusWaiting, parked.Status)
	require.True(t, parked.HoldsSlot, "a parked run keeps its slot")
	next := startOrder(t, c, "keeps", keyedOrder{Customer: "k", N: 1}, 0, 0)
	requireQueued(t, c, next.ID, "keeps", 1, parked.ID)
	signal(parked.ID)
	require.Equal(t, keyedOrder{Customer: "k", N: 0, Await: true}, receive(t, keeps.entered))
	keeps.release(t, "k")
	require.Equal(t, keyedOrder{Customer: "k", N: 1}, receive(t, keeps.entered), "the slot passed when the parked run finished")
	keeps.release(t, "k")
	eventuallySucceeds(t, c, next.ID)

	// Released: the next run executes while the first awaits; woken, the
	// first queues behind it.
	parked = startOrder(t, c, "releases", keyedOrder{Customer: "r", N: 0, Await: true}, 0, 0)
	require.Equal(t, engine.StatusWaiting, parked.Status)
	require.False(t, parked.HoldsSlot, "released while parked")
	next = startOrder(t, c, "releases", keyedOrder{Customer: "r", N: 1}, -1, 0)
	require.Equal(t, keyedOrder{Customer: "r", N: 1}, receive(t, releases.entered), "the slot was free")
	signal(parked.ID)
	require.Eventually(t, func() bool {
		run, err := c.Why(ctx, parked.ID)
		return err == nil && run.Blocked != nil && run.Blocked.Reason == engine.BlockedConcurrency
	}, 30*time.Second, 10*time.Millisecond, "woken, it queues for the slot")
	requireQueued(t, c, parked.ID, "releases", 1, next.ID)
	releases.release(t, "r")
	require.Equal(t, keyedOrder{Customer: "r", N: 0, Await: true}, receive(t, releases.entered))
	releases.release(t, "r")
	eventuallySucceeds(t, c, parked.ID)
	journal := enginetest.RequirePhases(t, c, parked.ID, "go", "held")
	require.Equal(t, engine.KindSignal, journal[0].Kind, "the signal it woke for is consumed, not lost in the queue")
	require.Equal(t, 1, releases.mostInside("r"))
}

// A run whose executor died keeps its slot until it is resumed (after its
// lease went stale) and finishes: the slot is never given to another run
// while the first may still be executing, and it is never lost.
func TestADeadHoldersSlotPassesOnlyOnceItIsResumedAndFinishes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "crashy", func(ctx context.Context, in keyedOrder) (int, error) {
		if _, err := engine.Atomic(ctx, "first", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, fmt.Sprint("first-", in.N)) }, nil); err != nil {
			return 0, err
		}
		return engine.Atomic(ctx, "second", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, fmt.Sprint("second-", in.N)) }, nil)
	}, &engine.WorkflowOpts{Concurrency: &engine.Concurrency{Key: "customer", Limit: 1}})
	require.NoError(t, err)
	c := b.client(t, workflows, &engine.Config{StaleAfter: time.Minute})

	input := func(n int) []byte { return []byte(fmt.Sprintf(`{"customer": "c", "n": %d}`, n)) }
	_, err = c.Start(enginetest.CrashAfter(ctx, "first"), engine.StartParams{Workflow: "crashy", IdempotencyKey: "dead", Input: input(0)})
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	dead := b.runIDForKey(t, "dead")
	res, err := c.Start(ctx, engine.StartParams{Workflow: "crashy", IdempotencyKey: "next", Input: input(1)})
	require.NoError(t, err)
	requireQueued(t, c, res.Run.ID, "crashy/c", 1, dead)
	n, err := c.PassFreeSlots(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a dead holder's slot is not free while its lease may still be live")
	requireQueued(t, c, res.Run.ID, "crashy/c", 1, dead)

	other := b.client(t, workflows, &engine.Config{StaleAfter: time.Minute})
	b.expireLease(t, dead)
	run, err := other.TakeOver(ctx, dead)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	require.False(t, run.HoldsSlot)
	requireDue(t, c, res.Run.ID, "the slot passed as the resumed holder finished")
	startRecoverer(t, other)
	eventuallySucceeds(t, other, res.Run.ID)
	for _, name := range []string{"first-0", "second-0", "first-1", "second-1"} {
		require.Equal(t, 1, b.counter(t, name), name)
	}
}

// A slot that no pass reached — the run it passed to was cancelled before
// it took it — passes on at the next sweep.
func TestPassFreeSlotsWakesTheRunsNoPassReached(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	l := registerLimited(t, workflows, "refund", &engine.Concurrency{Key: "customer", Limit: 1})
	ends := make(runEnds, 10)
	c := b.client(t, workflows, &engine.Config{StaleAfter: time.Minute, Hooks: ends})

	holder := startOrder(t, c, "refund", keyedOrder{Customer: "a", N: 0}, -1, 0)
	receive(t, l.entered)
	passedTo := startOrder(t, c, "refund", keyedOrder{Customer: "a", N: 1}, 0, 0)
	last := startOrder(t, c, "refund", keyedOrder{Customer: "a", N: 2}, 0, 0)
	l.release(t, "a")
	require.Equal(t, engine.StatusSucceeded, receive(t, ends).Status)
	requireDue(t, c, passedTo.ID, "the finishing holder passed its slot to the oldest queued run")
	requireQueued(t, c, last.ID, "refund/a", 1)
	_, err := c.Cancel(ctx, passedTo.ID)
	require.NoError(t, err)
	enginetest.RequireStatus(t, c, passedTo.ID, engine.StatusCancelled)

	n, err := c.PassFreeSlots(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	requireDue(t, c, last.ID, "the sweep passed the free slot")
	n, err = c.PassFreeSlots(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing more to pass")

	claimed, err := c.ClaimDue(ctx, 10)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	done := make(chan *engine.Run)
	go func() {
		run, _ := c.Continue(ctx, claimed[0])
		done <- run
	}()
	require.Equal(t, keyedOrder{Customer: "a", N: 2}, receive(t, l.entered))
	l.release(t, "a")
	require.Equal(t, engine.StatusSucceeded, receive(t, done).Status)
	require.Equal(t, holder.Workflow, "refund")
	require.Equal(t, 1, l.mostInside("a"))
}

// Declarations are checked at registration, keys at the start: a bad one
// is an error that creates no run.
func TestConcurrencyDeclarationsAndKeysAreChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	noop := func(context.Context, json.RawMessage) (int, error) { return 1, nil }
	for _, bad := range []engine.Concurrency{{Limit: 0}, {Limit: -1}, {Key: "a..b", Limit: 1}, {Key: ".a", Limit: 1}, {Group: "a group", Limit: 1}} {
		_, err := engine.Register(workflows, "bad", noop, &engine.WorkflowOpts{Concurrency: &bad})
		require.Error(t, err, "%+v", bad)
		require.Contains(t, err.Error(), "concurrency")
	}
	_, err := engine.Register(workflows, "byid", noop, &engine.WorkflowOpts{Concurrency: &engine.Concurrency{Key: "customer.id", Limit: 2, Group: "customers"}})
	require.NoError(t, err)
	_, err = engine.Register(workflows, "free", noop, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)

	for i, bad := range []struct {
		workflow, input string
		p               engine.StartParams
		why             string
	}{
		{"byid", `{}`, engine.StartParams{}, `"customer.id" is missing`},
		{"byid", `{"customer": "c_1"}`, engine.StartParams{}, "no object there"},
		{"byid", `{"customer": {"id": true}}`, engine.StartParams{}, "not a string or a number"},
		{"byid", `{"customer": {"id": ""}}`, engine.StartParams{}, "empty"},
		{"byid", `{}`, engine.StartParams{StartOpts: engine.StartOpts{ConcurrencyKey: "a\nb"}}, "control character"},
		{"byid", `{"customer": {"id": 1}}`, engine.StartParams{StartOpts: engine.StartOpts{ConcurrencyLimit: -1}}, "limit -1"},
		{"free", `{}`, engine.StartParams{StartOpts: engine.StartOpts{ConcurrencyLimit: -3}}, "limit -3"},
	} {
		p := bad.p
		p.Workflow, p.IdempotencyKey, p.Input = bad.workflow, fmt.Sprint("bad-", i), []byte(bad.input)
		_, err := c.Start(ctx, p)
		require.ErrorIs(t, err, engine.ErrInvalidInput, bad.input)
		require.Contains(t, err.Error(), bad.why)
	}
	require.Zero(t, b.countRows(t, "runs"), "no run was created")

	for _, ok := range []struct {
		workflow, input string
		p               engine.StartParams
		key             string
		limit           int
	}{
		{"byid", `{"customer": {"id": "c_1"}}`, engine.StartParams{}, "customers/c_1", 2},
		{"byid", `{"customer": {"id": 42}}`, engine.StartParams{StartOpts: engine.StartOpts{ConcurrencyLimit: 5}}, "customers/42", 5},
		{"byid", `{}`, engine.StartParams{StartOpts: engine.StartOpts{ConcurrencyKey: "named"}}, "customers/named", 2},
		{"free", `{}`, engine.StartParams{StartOpts: engine.StartOpts{ConcurrencyKey: "x", ConcurrencyLimit: 1}}, "free/x", 1},
	} {
		p := ok.p
		p.Workflow, p.IdempotencyKey, p.Input = ok.workflow, ok.key, []byte(ok.input)
		res, err := c.Start(ctx, p)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, res.Run.Status)
		require.Equal(t, ok.key, *res.Run.ConcurrencyKey)
		require.Equal(t, ok.limit, *res.Run.ConcurrencyLimit)
		require.False(t, res.Run.HoldsSlot, "given up as it finished")
	}
	res, err := c.Start(ctx, engine.StartParams{Workflow: "free", IdempotencyKey: "unlimited", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Nil(t, res.Run.ConcurrencyKey, "no declaration, no override: no key")
}

// Many runs of few keys, started at once by two clients, never exceed a
// key's limit, and every one finishes.
func TestConcurrencyLimitHoldsUnderContention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	var mu sync.Mutex
	inside, most := map[string]int{}, map[string]int{}
	_, err := engine.Register(workflows, "contended", func(ctx context.Context, in keyedOrder) (int, error) {
		return engine.Atomic(ctx, "held", func(ctx context.Context, tx pgx.Tx) (int, error) {
			mu.Lock()
			inside[in.Customer]++
			most[in.Customer] = max(most[in.Customer], inside[in.Customer])
			mu.Unlock()
			defer func() { mu.Lock(); inside[in.Customer]--; mu.Unlock() }()
			// Long enough for the other runs of the key to try.
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.005)`); err != nil {
				return 0, err
			}
			return bump(ctx, tx, in.Customer)
		}, nil)
	}, &engine.WorkflowOpts{Concurrency: &engine.Concurrency{Key: "customer", Limit: 2}})
	require.NoError(t, err)
	clients := []*engine.Client{b.client(t, workflows, nil), b.client(t, workflows, nil)}
	for _, c := range clients {
		startRecoverer(t, c)
	}
	const perKey = 15
	keys := []string{"k1", "k2", "k3"}
	var wg sync.WaitGroup
	for i := range perKey * len(keys) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := keyedOrder{Customer: keys[i%len(keys)], N: i}
			input, _ := json.Marshal(in)
			_, err := clients[i%2].Start(ctx, engine.StartParams{Workflow: "contended", IdempotencyKey: fmt.Sprint("run-", i), Input: input})
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		var left int
		return b.pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs WHERE status <> 'succeeded' OR holds_slot`).Scan(&left) == nil && left == 0
	}, 60*time.Second, 20*time.Millisecond, "every run succeeds and gives its slot up")
	for _, k := range keys {
		require.Equal(t, perKey, b.counter(t, k), k)
		mu.Lock()
		require.LessOrEqual(t, most[k], 2, "key %s: the limit is kept", k)
		mu.Unlock()
	}
}
