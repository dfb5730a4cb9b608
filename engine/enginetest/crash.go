package enginetest

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/crashpoint"
)

// ErrCrashed is what a call returns whose execution crashed at the point
// CrashAfter set.
var ErrCrashed = crashpoint.ErrCrashed

// CrashAfter returns a context whose executions (Start's, TakeOver's,
// Continue's) crash right after committing the phase called phase, as if
// the process were killed at that moment: the phase's writes are
// committed, nothing else is written, and the run stays leased to the dead
// executor until its lease expires. The call returns an error wrapping
// ErrCrashed. A phase answered from the journal does not crash. A step it
// names commits its result by itself, as with Config.CommitStepsAlone,
// rather than with the run's next commit: the crash lands right after the
// step, with nothing written after it.
func CrashAfter(ctx context.Context, phase string) context.Context {
	return crashpoint.After(ctx, phase)
}

// Recover does what a worker does once a crashed run's lease is stale,
// without the wait: it expires the lease, then takes the run over with c
// (a client standing for another process: a new one, with the same
// workflows) and executes it from its recovery point. It returns the run
// as the execution left it.
func (d *Database) Recover(ctx context.Context, c *engine.Client, runID string) (*engine.Run, error) {
	_, err := d.Pool.Exec(ctx, `UPDATE ratchet.runs SET lease_expires_at = now() - interval '1 millisecond'
		WHERE id = $1 AND finished_at IS NULL AND lease_expires_at > now()`, runID)
	if err != nil {
		return nil, fmt.Errorf("enginetest: expire the lease of run %s: %w", runID, err)
	}
	return c.TakeOver(ctx, runID)
}

// RequirePhases fails the test unless the run's journal holds exactly the
// named phases, in order.
func RequirePhases(tb testing.TB, c *engine.Client, runID string, want ...string) []engine.Phase {
	tb.Helper()
	journal, err := c.Phases(context.Background(), runID)
	if err != nil {
		tb.Fatalf("enginetest: journal of run %s: %v", runID, err)
	}
	got := make([]string, len(journal))
	for i, p := range journal {
		got[i] = p.Name
	}
	if !slices.Equal(got, want) {
		tb.Fatalf("enginetest: run %s journaled %q, want %q", runID, got, want)
	}
	return journal
}

// RequireStatus fails the test unless the run has the status.
func RequireStatus(tb testing.TB, c *engine.Client, runID string, want engine.Status) *engine.Run {
	tb.Helper()
	run, err := c.GetRun(context.Background(), runID)
	if err != nil {
		tb.Fatalf("enginetest: run %s: %v", runID, err)
	}
	if run.Status != want {
		msg := ""
		if run.Error != nil {
			msg = fmt.Sprintf(" (%s: %s)", run.Error.Code, run.Error.Message)
		}
		tb.Fatalf("enginetest: run %s is %s%s, want %s", runID, run.Status, msg, want)
	}
	return run
}

// ChildKey is the child key the run's step (or undo) named phase sends
// downstream, in the run's key format: what a fake downstream recorded
// the call under.
func ChildKey(tb testing.TB, run *engine.Run, phase string) string {
	tb.Helper()
	key, err := run.ChildKey(phase)
	if err != nil {
		tb.Fatalf("enginetest: %v", err)
	}
	return string(key)
}
