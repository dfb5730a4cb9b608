package engine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

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
// then their finishes, in one batch each: 4 round trips and commits where
// alone they would be 32. The window is long: a batch is sent when every
// execution in progress has joined it, not when the window ends.
func TestConcurrentStepResultsAndFinishesCommitTogether(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 8
	c := b.client(t, barrierSteps(t, waitGroupOf(n)), &engine.Config{CommitWindow: time.Second})
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("together-", i)
	}
	for key, err := range startAll(c, keys) {
		require.NoError(t, err, key)
	}
	batches, statements, refused := c.CommitBatches()
	require.Equal(t, [3]int64{4, 4 * n, 0}, [3]int64{batches, statements, refused},
		"one batch for each step's results and one for the finishes")
	var phases, succeeded int
	require.NoError(t, b.pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM ratchet.phases WHERE kind = 'step' AND attempts = 1 AND child_key IS NOT NULL),
			(SELECT count(*) FROM ratchet.runs WHERE status = 'succeeded' AND recovery_point = 'three' AND output = '"done"')`).
		Scan(&phases, &succeeded))
	require.Equal(t, [2]int{3 * n, n}, [2]int{phases, succeeded})
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
