package worker_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/testproc"
)

// The points at which the executing process is killed: before and after
// each phase's commit, and inside the external step after the gateway
// charged.
var killPoints = []string{
	"reserved.before-commit", "reserved.after-commit",
	"charged.mid", "charged.after-commit",
	"posted.before-commit", "posted.after-commit",
}

// worker is a helper process running a full worker, as `ratchet serve`
// deploys it, with the lease owner id it printed.
type workerProc struct {
	*testproc.Proc
	id string
}

func startWorkerProc(t *testing.T, env ...string) workerProc {
	t.Helper()
	p := startProc(t, env...)
	line, _ := p.Printed("READY ")
	return workerProc{Proc: p, id: strings.TrimPrefix(line, "READY ")}
}

// riverLeader waits until one of procs is River's elected leader and
// returns its index.
func (b *testBundle) riverLeader(t *testing.T, procs []workerProc) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var id string
		err := b.pool.QueryRow(context.Background(), `SELECT leader_id FROM ratchet.river_leader WHERE expires_at > now()`).Scan(&id)
		if !errors.Is(err, pgx.ErrNoRows) {
			require.NoError(t, err)
		}
		for i, p := range procs {
			if id != "" && strings.HasPrefix(p.id, id) { // River keeps 100 characters of it
				return i
			}
		}
		time.Sleep(20 * time.Millisecond) // no event to wait on in another process
	}
	t.Fatal("no River leader among the workers")
	return -1
}

// trial is one crashed or paused execution and when it was stopped.
type trial struct {
	key, kind string
	at        time.Time
}

// TestKilledAndPausedWorkersRunsFinishWithinStaleAfterPlusASecond kills
// worker processes, the River leader among them, at every phase boundary
// and at random moments, and pauses one past its lease (SIGSTOP, then
// SIGCONT): every run must finish within stale_after + 1 s of its
// executor's death, each side effect once, and the woken zombie must write
// nothing.
//
// Each round has a database of its own, three long-lived workers (one of
// them River's leader) and eight short-lived workers that each execute one
// run inline, as an API process does, and are killed. In even rounds the
// leader is killed and another worker paused; in odd rounds the leader is
// paused and another killed.
func TestKilledAndPausedWorkersRunsFinishSoonAfterStaleAfter(t *testing.T) {
	// Not parallel: it measures latencies, and the package's parallel
	// tests (which start processes of their own) wait until the
	// sequential ones are done.
	const staleAfter = 2 * time.Second
	rounds := 3
	if n, err := strconv.Atoi(os.Getenv("RATCHET_RECOVERY_ROUNDS")); err == nil && n > 0 {
		rounds = n // for the recovery latency figures
	}
	latencies := map[string][]time.Duration{}
	for round := range rounds {
		for kind, ds := range recoveryRound(t, round, staleAfter) {
			latencies[kind] = append(latencies[kind], ds...)
		}
	}
	var all []time.Duration
	for _, kind := range []string{"worker", "leader", "zombie"} {
		ds := latencies[kind]
		all = append(all, ds...)
		t.Logf("%-6s victims: %2d trials, recovery from kill or pause to finished run: p50 %s, p99 %s, max %s",
			kind, len(ds), percentile(ds, 0.5).Round(time.Millisecond), percentile(ds, 0.99).Round(time.Millisecond), percentile(ds, 1).Round(time.Millisecond))
	}
	require.GreaterOrEqual(t, len(all), 20)
	// The lease, then one poll (≤ 550 ms) and the rest of the run's work:
	// well under a second on a quiet machine (the figures above), 3 s
	// leaves room for one several times slower.
	require.LessOrEqual(t, percentile(all, 0.99), staleAfter+3*time.Second, "p99 over %d trials", len(all))
}

// recoveryRound runs one round and returns its recovery latencies by kind
// of victim.
func recoveryRound(t *testing.T, round int, staleAfter time.Duration) map[string][]time.Duration {
	b := setup(t)
	// Charges take a moment, so that a kill at a random time finds the run
	// mid-way.
	b.gateway.SetFaults(fakes.Faults{Latency: 100 * time.Millisecond})
	env := b.env("STALE_AFTER=" + staleAfter.String())

	fleet := []workerProc{startWorkerProc(t, env...), startWorkerProc(t, env...), startWorkerProc(t, env...)}
	leader := b.riverLeader(t, fleet)
	killed, paused := leader, (leader+1)%3
	if round%2 == 1 {
		killed, paused = paused, leader
	}
	victims := make([]workerProc, len(killPoints)+2)
	for i := range victims {
		victims[i] = startWorkerProc(t, env...)
	}

	var (
		mu     sync.Mutex
		trials []trial
		wg     sync.WaitGroup
	)
	record := func(key, kind string) {
		mu.Lock()
		defer mu.Unlock()
		trials = append(trials, trial{key: key, kind: kind, at: time.Now()})
	}
	key := func(what string) string { return fmt.Sprintf("r%d-%s", round, what) }
	killAt := func(p workerProc, k, point, kind string) {
		defer wg.Done()
		p.Send("start " + k + " " + point)
		p.Expect("AT " + point + " " + k)
		p.Signal(syscall.SIGKILL)
		record(k, kind)
		p.Wait()
	}
	for i, point := range killPoints {
		wg.Add(1)
		go killAt(victims[i], key("boundary-"+point), point, "worker")
	}
	for _, p := range victims[len(killPoints):] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := key(fmt.Sprintf("random-%d", p.Process().Pid))
			p.Send("start " + k)
			time.Sleep(rand.N(150 * time.Millisecond)) // the random point itself, not a wait
			p.Signal(syscall.SIGKILL)
			// A run killed before it was created, or after it finished, is
			// no recovery trial.
			var unfinished bool
			err := b.pool.QueryRow(context.Background(),
				`SELECT finished_at IS NULL FROM ratchet.runs WHERE idempotency_key = $1`, k).Scan(&unfinished)
			if unfinished {
				record(k, "worker")
			} else if !errors.Is(err, pgx.ErrNoRows) {
				assert.NoError(t, err)
			}
			p.Wait()
		}()
	}
	killedKind := "worker"
	if killed == leader {
		killedKind = "leader"
	}
	wg.Add(1)
	go killAt(fleet[killed], key("fleet-"+killPoints[round%len(killPoints)]), killPoints[round%len(killPoints)], killedKind)

	zombie := fleet[paused]
	zk := key("zombie")
	zombie.Send("start " + zk + " posted.before-commit")
	zombie.Expect("AT posted.before-commit " + zk)
	zombie.Signal(syscall.SIGSTOP)
	record(zk, "zombie")
	wg.Wait()

	keys := make([]string, len(trials))
	for i, tr := range trials {
		keys[i] = tr.key
	}
	finished := b.awaitFinished(t, time.Minute, keys...)

	// The zombie wakes and stops: by its own clock its lease may have
	// expired (its heartbeats went unconfirmed), or its next fenced write
	// finds the token changed. Either way it writes nothing (checked
	// below) and goes on serving.
	zombie.Signal(syscall.SIGCONT)
	zombie.Send("go")
	require.Contains(t, zombie.Expect("DONE "+zk), "lease lost")
	zombie.Send("start " + key("after-waking"))
	require.Equal(t, "DONE "+key("after-waking")+" succeeded", zombie.Expect("DONE "+key("after-waking")), "the woken process keeps serving")
	b.requireExactlyOnce(t, append(keys, key("after-waking"))...)

	// The round's survivors are done: they leave, so that the rounds'
	// processes do not add up to more connections than Postgres allows.
	for i, p := range fleet {
		if i != killed {
			p.Signal(syscall.SIGTERM)
			require.NoError(t, p.Wait())
		}
	}
	out := map[string][]time.Duration{}
	for _, tr := range trials {
		out[tr.kind] = append(out[tr.kind], finished[tr.key].Sub(tr.at))
	}
	return out
}

// A worker stopping gracefully while it executes a run it found due hands
// the run over when its grace ends, and another process finishes it at once.
func TestSIGTERMHandsADiscoveredRunOverWellBeforeStaleAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const staleAfter = 20 * time.Second
	env := b.env("STALE_AFTER=" + staleAfter.String())
	leaving := startWorkerProc(t, append(env, "PAUSE_AT=charged.after-commit", "GRACE=200ms")...)

	// The run is created unleased, as a service's own transaction creates
	// it; the only worker running finds it.
	workflows := engine.NewWorkflows()
	require.NoError(t, addOrderFlow(workflows, b.gwURL, &pauser{}))
	creator, err := engine.NewClient(b.pool, &engine.Config{Workflows: workflows})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		_, err := creator.StartTx(context.Background(), tx, engine.StartParams{Workflow: "order", IdempotencyKey: "t1", Input: orderInput("t1")})
		return err
	}))
	leaving.Expect("AT charged.after-commit t1")
	startWorkerProc(t, env...) // the process that continues it

	leaving.Signal(syscall.SIGTERM)
	termAt := time.Now()
	finished := b.watchFinished(30*time.Second, "t1")
	require.NoError(t, leaving.Wait(), "a graceful stop exits 0")
	_, stopped := leaving.Printed("STOPPED")
	require.True(t, stopped)
	leaving.AwaitLog("handed run over")

	took := finished(t)["t1"].Sub(termAt)
	// At once: a poll after the hand-over (well under a second, the log
	// says), not after stale_after; half of it is room for a slow machine.
	require.Less(t, took, staleAfter/2, "continued at once, not after stale_after (%s)", staleAfter)
	b.requireExactlyOnce(t, "t1")
	t.Logf("SIGTERM to finished run on another process: %s (grace 200ms)", took.Round(time.Millisecond))
}

// An inline execution (an API request's) in a worker stopping gracefully is
// handed over the same way.
func TestSIGTERMHandsAnInlineRunOverWellBeforeStaleAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const staleAfter = 20 * time.Second
	env := b.env("STALE_AFTER=" + staleAfter.String())
	startWorkerProc(t, env...)
	leaving := startWorkerProc(t, append(env, "PAUSE_AT=charged.after-commit", "RUN_KEY=t1", "GRACE=200ms")...)
	leaving.Expect("AT charged.after-commit t1")

	leaving.Signal(syscall.SIGTERM)
	termAt := time.Now()
	finished := b.watchFinished(30*time.Second, "t1")
	require.NoError(t, leaving.Wait(), "a graceful stop exits 0")
	done, _ := leaving.Printed("DONE t1")
	require.Contains(t, done, "shutting down", "its execution was handed over")

	require.Less(t, finished(t)["t1"].Sub(termAt), staleAfter/2, "continued at once, not after stale_after (%s)", staleAfter)
	b.requireExactlyOnce(t, "t1")
}
