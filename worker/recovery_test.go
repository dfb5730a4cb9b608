package worker_test

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The points at which the executing process is killed: before and after
// each phase's commit, and inside the external step after the gateway
// charged.
var killPoints = []string{
	"reserved.before-commit", "reserved.after-commit",
	"charged.mid", "charged.after-commit",
	"posted.before-commit", "posted.after-commit",
}

func TestKilledAtEveryPhaseBoundaryRunsFinishWithinStaleAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const staleAfter = 2 * time.Second
	startProc(t, b.env("STALE_AFTER="+staleAfter.String())...) // the survivor: a worker

	rounds := 1
	if n, err := strconv.Atoi(os.Getenv("RATCHET_RECOVERY_ROUNDS")); err == nil && n > 0 {
		rounds = n // for the recovery latency figure: go test -run Killed -v ./worker/
	}
	var (
		mu       sync.Mutex
		killedAt = map[string]time.Time{}
		keys     []string
		wg       sync.WaitGroup
	)
	for round := range rounds {
		for _, point := range killPoints {
			key := fmt.Sprintf("kill-%d-%s", round, point)
			keys = append(keys, key)
			wg.Add(1)
			go func() {
				defer wg.Done()
				// The executing process serves a request inline, as an API
				// process does; it works no jobs.
				victim := startProc(t, b.env("STALE_AFTER="+staleAfter.String(), "INSERT_ONLY=1", "PAUSE_AT="+point, "RUN_KEY="+key)...)
				victim.Expect("AT " + point)
				victim.Signal(syscall.SIGKILL)
				mu.Lock()
				killedAt[key] = time.Now()
				mu.Unlock()
				victim.Wait()
			}()
		}
		wg.Wait()
	}
	finished := b.awaitFinished(t, time.Minute, keys...)

	var latencies []time.Duration
	for _, key := range keys {
		d := finished[key].Sub(killedAt[key])
		latencies = append(latencies, d)
		require.Less(t, d, staleAfter+2*time.Second, "run %s finished %s after the kill", key, d)
	}
	b.requireExactlyOnce(t, keys...)
	t.Logf("recovery latency from SIGKILL to finished run over %d trials (stale_after %s): median %s, p99 %s, max %s",
		len(latencies), staleAfter, percentile(latencies, 0.5).Round(time.Millisecond),
		percentile(latencies, 0.99).Round(time.Millisecond), percentile(latencies, 1).Round(time.Millisecond))
}

func TestZombieResumedAfterSIGSTOPIsFencedAndKeepsServing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const staleAfter = time.Second
	startProc(t, b.env("STALE_AFTER="+staleAfter.String())...)
	zombie := startProc(t, b.env("STALE_AFTER="+staleAfter.String(), "INSERT_ONLY=1", "PAUSE_AT=posted.before-commit", "RUN_KEY=z1")...)
	zombie.Expect("AT posted.before-commit z1")

	zombie.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	b.awaitFinished(t, 30*time.Second, "z1")
	require.GreaterOrEqual(t, time.Since(stopped), staleAfter/2, "taken over only once the lease went stale")
	zombie.Signal(syscall.SIGCONT)

	zombie.Send("go") // its next commit
	done := zombie.Expect("DONE z1")
	require.Contains(t, done, "lease lost")
	zombie.AwaitLog("superseded")
	b.requireExactlyOnce(t, "z1")

	zombie.Send("start z2")
	zombie.Expect("AT posted.before-commit z2")
	zombie.Send("go")
	require.Equal(t, "DONE z2 succeeded", zombie.Expect("DONE z2"), "the superseded process keeps serving")
	b.requireExactlyOnce(t, "z2")
}

func TestSIGTERMHandsRunOverWellBeforeStaleAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const staleAfter = 20 * time.Second
	startProc(t, b.env("STALE_AFTER="+staleAfter.String())...)
	leaving := startProc(t, b.env("STALE_AFTER="+staleAfter.String(), "PAUSE_AT=charged.after-commit", "RUN_KEY=t1", "GRACE=200ms")...)
	leaving.Expect("AT charged.after-commit t1")

	leaving.Signal(syscall.SIGTERM)
	termAt := time.Now()
	require.NoError(t, leaving.Wait(), "a graceful stop exits 0")
	done, _ := leaving.Printed("DONE t1")
	require.Contains(t, done, "shutting down", "its execution was handed over")
	_, stopped := leaving.Printed("STOPPED")
	require.True(t, stopped)

	finished := b.awaitFinished(t, 30*time.Second, "t1")
	took := finished["t1"].Sub(termAt)
	require.Less(t, took, 3*time.Second, "continued at once, not after stale_after (%s)", staleAfter)
	b.requireExactlyOnce(t, "t1")
	leaving.AwaitLog("handed run over")
}
