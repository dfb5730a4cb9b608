package worker_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A deploy with runs in flight, with real worker processes killed: a run
// the old build had charged when its process died is finished by the new
// build on v1's code; a run the new build started on v2 is finished on
// v2's code by another process after the first new one is killed too.
// Every effect and charge happens once.
func TestADeployFinishesOldRunsOnTheOldVersionThroughKills(t *testing.T) {
	t.Parallel()
	b := setup(t)

	old := startWorkerProc(t, b.env()...)
	old.Send("start old-1 charged.mid")
	old.Expect("AT charged.mid old-1") // charged at the gateway, not journaled
	old.Signal(syscall.SIGKILL)
	old.Wait()

	deployed := startWorkerProc(t, b.env("ORDER_VERSIONS=1,2")...)
	deployed.Send("start new-1 checked.after-commit")
	deployed.Expect("AT checked.after-commit new-1")
	deployed.Signal(syscall.SIGKILL)
	deployed.Wait()

	startWorkerProc(t, b.env("ORDER_VERSIONS=1,2")...)
	b.awaitFinished(t, 30*time.Second, "old-1", "new-1")
	b.requireExactlyOnce(t, "old-1", "new-1")

	versions := map[string]int{}
	for _, key := range []string{"old-1", "new-1"} {
		var v int
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT workflow_version FROM ratchet.runs WHERE idempotency_key = $1`, key).Scan(&v))
		versions[key] = v
	}
	require.Equal(t, map[string]int{"old-1": 1, "new-1": 2}, versions)
	effects := b.effects(t)
	require.Equal(t, 0, effects[[2]string{"old-1", "checked"}], "the old run ran v1's code")
	require.Equal(t, 1, effects[[2]string{"new-1", "checked"}], "the new run ran v2's code, once")
}
