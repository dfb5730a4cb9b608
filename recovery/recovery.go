package recovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/ratchet-run/ratchet/engine"
)

// Action is what to do about a run when its scheduled look comes.
type Action int

const (
	// Done: nothing left to do for this look. The run has finished, or a
	// newer claim has replaced the lease the look was scheduled for (and
	// made its own schedule).
	Done Action = iota
	// Wait: look again at Until (a live lease, or a retry not yet due).
	Wait
	// TakeOver: the lease is absent or expired and the run is due.
	TakeOver
)

func (a Action) String() string {
	return [...]string{"done", "wait", "take_over"}[a]
}

// Decision is Decide's answer.
type Decision struct {
	Action Action
	// Until is when to look again, by the database's clock (Wait only).
	Until  time.Time
	Reason string
}

// Decide says what a look scheduled for the run's lease token should do.
func Decide(s *engine.RunState, token int64) Decision {
	switch {
	case s.Status.Finished():
		return Decision{Action: Done, Reason: "run finished"}
	case s.LeaseToken != token:
		return Decision{Action: Done, Reason: "lease replaced by a newer claim"}
	case s.LeaseLive:
		return Decision{Action: Wait, Until: *s.LeaseExpiresAt, Reason: "lease is live"}
	case s.NextAttemptAt != nil && s.NextAttemptAt.After(s.Now):
		return Decision{Action: Wait, Until: *s.NextAttemptAt, Reason: "retry not yet due"}
	}
	return Decision{Action: TakeOver, Reason: "lease absent or expired"}
}

// Recoverer acts on decisions with an engine client.
type Recoverer struct {
	engine *engine.Client
	logger *slog.Logger
}

// New returns a Recoverer that takes runs over with c. A nil logger
// discards.
func New(c *engine.Client, logger *slog.Logger) *Recoverer {
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Recoverer{engine: c, logger: logger}
}

// Look performs a scheduled look at run runID for lease token. It returns
// how long to wait before looking again, or 0 when this look is done with.
// A takeover executes the run to its conclusion within Look.
func (r *Recoverer) Look(ctx context.Context, runID string, token int64) (time.Duration, error) {
	s, err := r.engine.Inspect(ctx, runID)
	if errors.Is(err, engine.ErrRunNotFound) {
		return 0, nil // pruned
	}
	if err != nil {
		return 0, err
	}
	d := Decide(s, token)
	switch d.Action {
	case Done:
		return 0, nil
	case Wait:
		return max(d.Until.Sub(s.Now), time.Millisecond), nil
	}

	log := r.logger.With(slog.String("run_id", runID), slog.Int64("stale_token", token), slog.String("recovery_point", s.RecoveryPoint))
	run, err := r.engine.Resume(ctx, runID)
	switch {
	case errors.Is(err, engine.ErrLeaseHeld):
		// Another claimant won; its claim scheduled its own look.
		return 0, nil
	case errors.Is(err, engine.ErrLeaseLost), errors.Is(err, engine.ErrShutdown):
		// Superseded, or handed over: whoever holds the run now has a look
		// scheduled.
		log.InfoContext(ctx, "recovery ended early", slog.String("reason", err.Error()))
		return 0, nil
	case err != nil && run != nil:
		// Claimed, then cut short (ctx ended, database trouble): the claim
		// scheduled a look at its own lease.
		log.WarnContext(ctx, "recovered execution cut short", slog.String("error", err.Error()))
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("recovery: take over run %s: %w", runID, err)
	}
	log.InfoContext(ctx, "run recovered", slog.String("status", string(run.Status)),
		slog.Int64("lease_token", run.LeaseToken), slog.Int("attempt", run.Attempt))
	return 0, nil
}
