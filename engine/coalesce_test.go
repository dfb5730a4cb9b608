package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
)

// barrierSteps registers a workflow of three steps that call nothing; the
// first step of each run calls arrive (with the run's idempotency key)
// before it returns.
func barrierSteps(t *testing.T, arrive func(ctx context.Context, key string)) *engine.Workflows {
	t.Helper()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "steps3", func(ctx context.Context, in struct{ Key string }) (string, error) {
		for i, name := range []string{"one", "two", "three"} {
			if _, err := engine.Step(ctx, name, func(ctx context.Context, _ steps.Key) (int, error) {
				if i == 0 {
					arrive(ctx, in.Key)
				}
				return i, nil
			}, nil); err != nil {
				return "", err
			}
		}
		return "done", nil
	}, nil)
	require.NoError(t, err)
	return workflows
}

// startAll starts one run per key at once and returns each one's outcome.
func startAll(c *engine.Client, keys []string) map[string]error {
	var (
		mu  sync.Mutex
		out = map[string]error{}
		wg  sync.WaitGroup
	)
	for _, key := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Start(context.Background(), engine.StartParams{
				Workflow: "steps3", IdempotencyKey: key, Input: fmt.Appendf(nil, `{"Key":%q}`, key)})
			if err == nil && res.Run.Status != engine.StatusSucceeded {
				err = fmt.Errorf("run %s ended %s", key, res.Run.Status)
			}
			mu.Lock()
			out[key] = err
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// waitGroupOf returns an arrive function that returns once n callers have
// called it.
func waitGroupOf(n int) func(context.Context, string) {
	var wg sync.WaitGroup
	wg.Add(n)
	return func(context.Context, string) { wg.Done(); wg.Wait() }
}

// Eight runs whose steps finish together commit each step's results, and
// then their finishes, in one batch each; the last step's results go with
// the finishes: 3 round trips and commits where alone they would be 24 (4
// and 32 when each step commits alone). The window is long: a batch is
// sent when every execution in progress has joined it, not when the
// window ends.
func TestConcurrentStepResultsAndFinishesCommitTogether(t *testing.T) {
	t.Parallel()
	const n = 8
	for _, tc := range []struct {
		name    string
		alone   bool
		batches int64
	}{{"last step with the finish", false, 3}, {"steps alone", true, 4}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			c := b.client(t, barrierSteps(t, waitGroupOf(n)), &engine.Config{CommitWindow: time.Second, CommitStepsAlone: tc.alone})
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprint("together-", i)
			}
			for key, err := range startAll(c, keys) {
				require.NoError(t, err, key)
			}
			batches, statements, refused := c.CommitBatches()
			require.Equal(t, [3]int64{tc.batches, tc.batches * n, 0}, [3]int64{batches, statements, refused},
				"one batch for each commit of the runs")
			var phases, succeeded int
			require.NoError(t, b.pool.QueryRow(context.Background(), `
				SELECT (SELECT count(*) FROM ratchet.phases WHERE kind = 'step' AND attempts = 1 AND child_key IS NOT NULL),
					(SELECT count(*) FROM ratchet.runs WHERE status = 'succeeded' AND recovery_point = 'three' AND output = '"done"')`).
				Scan(&phases, &succeeded))
			require.Equal(t, [2]int{3 * n, n}, [2]int{phases, succeeded})
		})
	}
}

// A run whose lease was taken over while its step ran is refused by its
// own fence in the batch; the run it shares the batch with commits.
func TestALostLeaseInABatchLeavesTheOthersCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	together := waitGroupOf(2)
	c := b.client(t, barrierSteps(t, func(ctx context.Context, key string) {
		if key == "superseded" {
			// Another executor takes the run over meanwhile.
			_, err := b.pool.Exec(ctx, `UPDATE ratchet.runs SET lease_token = lease_token + 1, lease_owner = 'someone else'
				WHERE tenant = 'default' AND idempotency_key = $1`, key)
			require.NoError(t, err)
		}
		together(ctx, key)
	}), &engine.Config{CommitWindow: time.Second})
	outcome := startAll(c, []string{"superseded", "kept"})
	require.NoError(t, outcome["kept"])
	require.ErrorIs(t, outcome["superseded"], engine.ErrLeaseLost)
	batches, statements, refused := c.CommitBatches()
	require.Equal(t, [3]int64{1, 2, 0}, [3]int64{batches, statements, refused},
		"the first step's results in one batch; afterwards only one run is executing")
	var kept, superseded int
	require.NoError(t, b.pool.QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE r.idempotency_key = 'kept'), count(*) FILTER (WHERE r.idempotency_key = 'superseded')
		FROM ratchet.phases p JOIN ratchet.runs r ON r.id = p.run_id`).Scan(&kept, &superseded))
	require.Equal(t, [2]int{3, 0}, [2]int{kept, superseded})
}

// A statement the server refuses rolls its batch back whole; each
// statement is then sent again alone, so that only its run fails to
// commit.
func TestARefusedStatementFailsOnlyItsOwnRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(context.Background(), `
		CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT idempotency_key FROM ratchet.runs WHERE id = NEW.run_id) = 'poison' THEN
				RAISE EXCEPTION 'the journal refuses this run';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_poison BEFORE INSERT ON ratchet.phases FOR EACH ROW EXECUTE FUNCTION refuse_poison();`)
	require.NoError(t, err)
	c := b.client(t, barrierSteps(t, waitGroupOf(2)), &engine.Config{
		CommitWindow: time.Second,
		Retry:        engine.RetryPolicy{InitialInterval: time.Hour, MaxInterval: time.Hour},
	})
	outcome := startAll(c, []string{"poison", "healthy"})
	require.NoError(t, outcome["healthy"])
	require.ErrorContains(t, outcome["poison"], "ended pending", "released to be retried")
	batches, _, refused := c.CommitBatches()
	require.Equal(t, [2]int64{1, 1}, [2]int64{batches, refused})
	var runErr string
	var phases int
	require.NoError(t, b.pool.QueryRow(context.Background(), `
		SELECT error->>'message', (SELECT count(*) FROM ratchet.phases WHERE run_id = r.id) FROM ratchet.runs r WHERE idempotency_key = 'poison'`).
		Scan(&runErr, &phases))
	require.Contains(t, runErr, "the journal refuses this run")
	require.Zero(t, phases)
	require.Equal(t, 3, countPhases(t, b, "healthy"))
}

// A run executing by itself does not wait out the window at each commit:
// its batch is complete as soon as it joins.
func TestALoneExecutionDoesNotWaitForTheWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, barrierSteps(t, func(context.Context, string) {}), &engine.Config{CommitWindow: time.Second})
	began := time.Now()
	require.NoError(t, startAll(c, []string{"alone"})["alone"])
	// Its four commits waiting out the (longest allowed) window would take
	// 4 s; on a machine even ten times slower than usual they take well
	// under a second without.
	require.Less(t, time.Since(began), 3*time.Second)
	batches, _, _ := c.CommitBatches()
	require.Zero(t, batches)
}

// A negative window sends every statement alone.
func TestANegativeWindowSendsEveryCommitAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, barrierSteps(t, waitGroupOf(4)), &engine.Config{CommitWindow: -1})
	for key, err := range startAll(c, []string{"a", "b", "c", "d"}) {
		require.NoError(t, err, key)
	}
	batches, _, _ := c.CommitBatches()
	require.Zero(t, batches)
}

// A statement that commits by itself and meets a standby's refusal
// (25006) is sent once more: with a pool that drops such a connection, as
// the service's does, it goes out on a fresh one and commits.
func TestAStatementRefusedAsReadOnlyIsSentAgainOnAFreshConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(b.url)
	require.NoError(t, err)
	cfg.MaxConns = 1
	cfg.ConnConfig.OnPgError = func(_ *pgconn.PgConn, e *pgconn.PgError) bool { return e.Code != pgerrcode.ReadOnlySQLTransaction }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	c, err := engine.NewClient(pool, &engine.Config{Workflows: barrierSteps(t, func(context.Context, string) {}), CommitWindow: -1})
	require.NoError(t, err)
	// The pool's one connection now answers as a demoted primary would.
	_, err = pool.Exec(ctx, `SET default_transaction_read_only = on`)
	require.NoError(t, err)
	require.NoError(t, startAll(c, []string{"k"})["k"])
	require.EqualValues(t, 1, c.ReadOnlyRetries(), "the claim, sent again")
	require.Equal(t, 3, countPhases(t, b, "k"))
}

func countPhases(t *testing.T, b *testBundle, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `
		SELECT count(*) FROM ratchet.phases p JOIN ratchet.runs r ON r.id = p.run_id WHERE r.idempotency_key = $1`, key).Scan(&n))
	return n
}

// A cancellation requested while a step ran reaches its run through a
// batch: the step's result is kept (the call happened), the run stops at
// that boundary as cancelled, and the run beside it in the batch goes on.
func TestACancellationInABatchStopsOnlyItsRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	together := waitGroupOf(2)
	c := b.client(t, barrierSteps(t, func(ctx context.Context, key string) {
		if key == "cancelled" {
			_, err := b.pool.Exec(ctx, `UPDATE ratchet.runs SET cancel_requested_at = now() WHERE idempotency_key = $1`, key)
			require.NoError(t, err)
		}
		together(ctx, key)
	}), &engine.Config{CommitWindow: time.Second})
	outcome := startAll(c, []string{"cancelled", "kept"})
	require.NoError(t, outcome["kept"])
	require.ErrorContains(t, outcome["cancelled"], "ended cancelled")
	batches, _, _ := c.CommitBatches()
	require.GreaterOrEqual(t, batches, int64(1), "the first step's results in one batch")
	require.Equal(t, 1, countPhases(t, b, "cancelled"), "its step's result kept, nothing after")
	require.Equal(t, 3, countPhases(t, b, "kept"))
}

// payFlow is a charge (a step), the ledger's posting (an atomic phase) and
// a receipt (a step): the shapes whose step results ride in the next
// commit. Its fields steer and record what the phases do.
type payFlow struct {
	b *testBundle
	// keys are the child keys the charge was called with, in order.
	mu   sync.Mutex
	keys []steps.Key
	// post, when set, runs inside the posting's transaction.
	post func(ctx context.Context) error
}

func (f *payFlow) workflows(t *testing.T) *engine.Workflows {
	t.Helper()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "pay", func(ctx context.Context, _ struct{}) (string, error) {
		charge, err := engine.Step(ctx, "charge", func(ctx context.Context, key steps.Key) (string, error) {
			f.mu.Lock()
			f.keys = append(f.keys, key)
			f.mu.Unlock()
			return "ch_1", nil
		}, nil)
		if err != nil {
			return "", err
		}
		if _, err := engine.Atomic(ctx, "posted", func(ctx context.Context, tx pgx.Tx) (int, error) {
			if f.post != nil {
				if err := f.post(ctx); err != nil {
					return 0, err
				}
			}
			return bump(ctx, tx, "posted")
		}, nil); err != nil {
			return "", err
		}
		return engine.Step(ctx, "receipt", func(ctx context.Context, _ steps.Key) (string, error) {
			return "sent for " + charge, nil
		}, nil)
	}, nil)
	require.NoError(t, err)
	return workflows
}

func (f *payFlow) charges() []steps.Key {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]steps.Key(nil), f.keys...)
}

// transactions names, for each of the run's phases and for its row, the
// transaction that last wrote it (xmin): rows written by one commit share
// it.
func (b *testBundle) transactions(t *testing.T, runID string) map[string]string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `
		SELECT name, xmin::text FROM ratchet.phases WHERE run_id = $1
		UNION ALL SELECT 'run', xmin::text FROM ratchet.runs WHERE id = $1`, runID)
	require.NoError(t, err)
	out := map[string]string{}
	for rows.Next() {
		var name, xid string
		require.NoError(t, rows.Scan(&name, &xid))
		out[name] = xid
	}
	require.NoError(t, rows.Err())
	return out
}

// A step's result commits with the next atomic phase's transaction, and
// the last step's with the run's finish: the run's three phases and its
// end are two commits. With CommitStepsAlone each is its own.
func TestAStepResultCommitsWithTheNextCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := &payFlow{b: b}
	durable := &durableAtEnd{pool: b.pool, seen: map[string]bool{}}
	c := b.client(t, f.workflows(t), &engine.Config{Hooks: durable})
	f.post = func(ctx context.Context) error {
		// Inside the posting's transaction, the charge is not yet in the
		// journal for anyone else to read.
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.phases WHERE name = 'charge'`).Scan(&n); err != nil {
			return err
		}
		if n != 0 {
			return errors.New("the charge was journaled before the posting committed")
		}
		return nil
	}
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: "pay", IdempotencyKey: "p", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, res.Run.Status)
	require.JSONEq(t, `"sent for ch_1"`, string(res.Run.Output))
	xid := b.transactions(t, res.Run.ID)
	require.Equal(t, xid["charge"], xid["posted"], "the charge commits with the posting")
	require.Equal(t, xid["receipt"], xid["run"], "the receipt commits with the run's finish")
	require.NotEqual(t, xid["posted"], xid["run"])
	require.Equal(t, map[string]bool{"charge": true, "posted": true, "receipt": true}, durable.ended(),
		"each phase's hook ends once the phase is in the journal")

	f.post = nil
	alone := b.client(t, f.workflows(t), &engine.Config{CommitStepsAlone: true})
	res, err = alone.Start(context.Background(), engine.StartParams{Workflow: "pay", IdempotencyKey: "alone", Input: []byte(`{}`)})
	require.NoError(t, err)
	xid = b.transactions(t, res.Run.ID)
	require.Len(t, map[string]bool{xid["charge"]: true, xid["posted"]: true, xid["receipt"]: true, xid["run"]: true}, 4,
		"a commit each: %v", xid)
}

// durableAtEnd records, for each phase hook that ends without an error,
// whether the phase was in the journal at that moment.
type durableAtEnd struct {
	pool interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	}
	mu   sync.Mutex
	seen map[string]bool
}

func (d *durableAtEnd) Run(ctx context.Context, _ engine.RunInfo) (context.Context, func(engine.RunEnd)) {
	return ctx, func(engine.RunEnd) {}
}

func (d *durableAtEnd) Phase(ctx context.Context, info engine.PhaseInfo) (context.Context, func(error)) {
	return ctx, func(err error) {
		if err != nil || info.Replayed {
			return
		}
		var journaled bool
		if qerr := d.pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM ratchet.phases WHERE run_id = $1 AND name = $2)`,
			info.RunID, info.Name).Scan(&journaled); qerr != nil {
			panic(qerr)
		}
		d.mu.Lock()
		d.seen[info.Name] = journaled
		d.mu.Unlock()
	}
}

func (d *durableAtEnd) ended() map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]bool{}
	for k, v := range d.seen {
		out[k] = v
	}
	return out
}

// Before a step calls downstream, the step before it is durable: the
// second step's call finds the first in the journal.
func TestAStepCallsOnlyOnceTheStepBeforeItIsDurable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "two", func(ctx context.Context, _ struct{}) (bool, error) {
		if _, err := engine.Step(ctx, "one", func(context.Context, steps.Key) (int, error) { return 1, nil }, nil); err != nil {
			return false, err
		}
		return engine.Step(ctx, "two", func(ctx context.Context, _ steps.Key) (bool, error) {
			var journaled bool
			err := b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM ratchet.phases WHERE name = 'one')`).Scan(&journaled)
			return journaled, err
		}, nil)
	}, nil)
	require.NoError(t, err)
	res, err := b.client(t, workflows, nil).Start(context.Background(), engine.StartParams{Workflow: "two", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.JSONEq(t, `true`, string(res.Run.Output), "the first step was journaled before the second called")
}

// An execution superseded while it holds a step's result commits nothing:
// the next executor calls the step again with the same key, the journal
// holds each phase once, and the superseded step's hook ends with the
// lost lease.
func TestAHeldStepResultIsRefusedWithALostLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := &payFlow{b: b}
	entered, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	first.Store(true)
	f.post = func(ctx context.Context) error {
		if !first.CompareAndSwap(true, false) {
			return nil
		}
		close(entered)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	ends := &stepEnds{errs: map[string][]error{}}
	workflows := f.workflows(t)
	c := b.client(t, workflows, &engine.Config{Hooks: ends, StaleAfter: time.Minute})
	started := make(chan error, 1)
	go func() {
		_, err := c.Start(context.Background(), engine.StartParams{Workflow: "pay", IdempotencyKey: "p", Input: []byte(`{}`)})
		started <- err
	}()
	receive(t, entered)
	runID := b.runIDForKey(t, "p")
	b.expireLease(t, runID)
	run, err := b.client(t, workflows, nil).TakeOver(context.Background(), runID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	close(release)
	require.ErrorIs(t, receive(t, started), engine.ErrLeaseLost)

	keys := f.charges()
	require.Len(t, keys, 2, "called again by the executor that took over")
	require.Equal(t, keys[0], keys[1], "with the same key")
	require.Equal(t, 1, b.counter(t, "posted"), "posted once")
	var phases int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM ratchet.phases WHERE run_id = $1`, runID).Scan(&phases))
	require.Equal(t, 3, phases)
	charge := ends.of("charge")
	require.Len(t, charge, 1)
	require.ErrorIs(t, charge[0], engine.ErrLeaseLost, "the charge's hook says its result was not committed")
}

// stepEnds records each phase hook's end, by phase name.
type stepEnds struct {
	mu   sync.Mutex
	errs map[string][]error
}

func (s *stepEnds) Run(ctx context.Context, _ engine.RunInfo) (context.Context, func(engine.RunEnd)) {
	return ctx, func(engine.RunEnd) {}
}

func (s *stepEnds) Phase(ctx context.Context, info engine.PhaseInfo) (context.Context, func(error)) {
	return ctx, func(err error) {
		s.mu.Lock()
		s.errs[info.Name] = append(s.errs[info.Name], err)
		s.mu.Unlock()
	}
}

func (s *stepEnds) of(name string) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs[name]...)
}

// When the atomic phase after a step fails, the step's result is
// committed anyway: the run released for a retry resumes past the call.
func TestAHeldStepResultOutlivesTheFailureOfThePhaseAfterIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := &payFlow{b: b}
	var failures atomic.Int32
	failures.Store(1)
	f.post = func(context.Context) error {
		if failures.Add(-1) >= 0 {
			return errors.New("the ledger is busy")
		}
		return nil
	}
	workflows := f.workflows(t)
	c := b.client(t, workflows, &engine.Config{Retry: engine.RetryPolicy{InitialInterval: time.Hour, MaxInterval: time.Hour}})
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: "pay", IdempotencyKey: "p", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, res.Run.Status, "released for a retry")
	require.Equal(t, "charge", res.Run.RecoveryPoint, "past the charge")
	run, err := c.TakeOver(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	require.Len(t, f.charges(), 1, "charged once")
}

// A cancellation asked after a step ran, while its result is held, refuses
// the atomic phase that would carry it and keeps the result: the run ends
// cancelled at that boundary with the call journaled and nothing of the
// phase committed.
func TestACancellationDuringAStepKeepsItsHeldResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := &payFlow{b: b}
	f.post = func(ctx context.Context) error {
		info, _ := engine.RunInfoFrom(ctx)
		_, err := b.pool.Exec(ctx, `UPDATE ratchet.runs SET cancel_requested_at = now() WHERE id = $1`, info.RunID)
		return err
	}
	res, err := b.client(t, f.workflows(t), nil).Start(context.Background(), engine.StartParams{Workflow: "pay", IdempotencyKey: "p", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, res.Run.Status)
	require.Equal(t, "charge", res.Run.RecoveryPoint)
	require.Zero(t, b.counter(t, "posted"), "the posting rolled back")
	require.Len(t, b.transactions(t, res.Run.ID), 2, "the charge and the run")
}
