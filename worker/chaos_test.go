package worker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/testproc"
	"github.com/ratchet-run/ratchet/worker"
)

// TestChaosWorkersKilledAndRestarted: three worker processes share the
// runs; every couple of seconds one of them is killed with SIGKILL, at no
// point of its choosing, and a new one started in its place.
func TestChaosWorkersKilledAndRestarted(t *testing.T) {
	t.Parallel()
	runs := 500
	if n, err := strconv.Atoi(os.Getenv("RATCHET_CHAOS_RUNS")); err == nil && n > 0 {
		runs = n
	}
	b := setup(t)
	b.gateway.SetFaults(fakes.Faults{Latency: 5 * time.Millisecond}) // spread the work over some seconds
	const staleAfter = 2 * time.Second
	env := b.env("STALE_AFTER=" + staleAfter.String())

	// The runs are created as a service would in its own transaction; the
	// claim schedules each one's first look.
	workflows := engine.NewWorkflows()
	require.NoError(t, addOrderFlow(workflows, b.gwURL, &pauser{}))
	creator, err := worker.New(b.pool, &worker.Config{InsertOnly: true, Engine: engine.Config{Workflows: workflows}})
	require.NoError(t, err)
	keys := make([]string, runs)
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for i := range keys {
			keys[i] = fmt.Sprintf("chaos-%04d", i)
			if _, err := creator.Engine().StartTx(ctx, tx, engine.StartParams{Workflow: "order", IdempotencyKey: keys[i], Input: orderInput(keys[i])}); err != nil {
				return err
			}
		}
		return nil
	}))

	procs := []*testproc.Proc{startProc(t, env...), startProc(t, env...), startProc(t, env...)}
	kills := 0
	done := make(chan error, 1)
	go func() {
		_, err := b.pollFinished(5*time.Minute, keys...)
		done <- err
	}()
	// The first kill comes early, while there is surely work in flight.
	next := time.After(300 * time.Millisecond)
loop:
	for {
		select {
		case err := <-done:
			require.NoError(t, err)
			break loop
		case <-next:
			next = time.After(2 * time.Second)
			i := rand.IntN(len(procs))
			procs[i].Signal(syscall.SIGKILL)
			procs[i].Wait()
			kills++
			procs[i] = startProc(t, env...)
		}
	}
	t.Logf("%d runs finished with %d workers killed and restarted", runs, kills)
	require.Positive(t, kills, "the test killed no process: raise RATCHET_CHAOS_RUNS")
	b.requireExactlyOnce(t, keys...)
}
