package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// ErrShutdown is returned by Start and Resume once Shutdown has begun, and
// is the cause with which Shutdown cancels executions that outlast its
// grace: such an execution hands its run over instead of abandoning it.
var ErrShutdown = errors.New("engine: client is shutting down")

// enter admits a Start or Resume unless the client is shutting down. The
// returned function must be called when the call returns.
func (c *Client) enter() (done func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.draining {
		return nil, ErrShutdown
	}
	c.active++
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.active--
		if c.active == 0 && c.idle != nil {
			close(c.idle)
			c.idle = nil
		}
	}, nil
}

// track registers a running execution so that Shutdown can hand it over.
// The returned function unregisters it.
func (c *Client) track(ex *execution) (untrack func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.handingOver {
		ex.lose(ErrShutdown)
	}
	c.executions[ex] = struct{}{}
	return func() {
		c.mu.Lock()
		delete(c.executions, ex)
		c.mu.Unlock()
	}
}

// Shutdown stops the client from starting or resuming runs and waits for
// executions in progress to conclude. When ctx ends first (its deadline is
// the grace period), the remaining executions are stopped at once and hand
// their runs over: each releases its lease with a new token and schedules
// the run now, so another executor continues it without waiting for the
// lease to go stale. Shutdown returns when every execution has concluded.
func (c *Client) Shutdown(ctx context.Context) error {
	c.mu.Lock()
	c.draining = true
	idle := make(chan struct{})
	if c.active == 0 {
		close(idle)
	} else {
		c.idle = idle
	}
	c.mu.Unlock()

	select {
	case <-idle:
		return nil
	case <-ctx.Done():
	}
	c.mu.Lock()
	c.handingOver = true
	n := len(c.executions)
	for ex := range c.executions {
		ex.lose(ErrShutdown)
	}
	c.mu.Unlock()
	c.logger.Info("shutting down: handing over runs still executing", slog.Int("runs", n))
	<-idle
	return nil
}

// handOverSQL releases a run held by this execution and gives it a new
// token, so that the schedule made in the same transaction concerns the new
// lease and whatever was scheduled for the old one finds it moot.
const handOverSQL = `
UPDATE ratchet.runs SET
	lease_token = lease_token + 1,
	lease_owner = NULL,
	lease_expires_at = NULL,
	status = 'pending',
	updated_at = now()
WHERE id = $1 AND lease_token = $2 AND finished_at IS NULL
RETURNING ` + runColumns

// handOver releases the run of an execution stopped by Shutdown.
func (c *Client) handOver(ctx context.Context, ex *execution) (*Run, error) {
	// The execution's context is cancelled; the release gets a moment of
	// its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	run, ok, err := c.claim(ctx, nil, handOverSQL, ex.run.ID, ex.run.LeaseToken)
	if err != nil {
		return nil, fmt.Errorf("engine: hand over run %s: %w", ex.run.ID, err)
	}
	if !ok {
		return nil, ex.leaseLost(ctx)
	}
	c.logger.InfoContext(ctx, "handed run over for another executor", slog.String("run_id", ex.run.ID),
		slog.Int64("lease_token", run.LeaseToken), slog.String("recovery_point", run.RecoveryPoint))
	return run, fmt.Errorf("engine: run %s handed over: %w", ex.run.ID, ErrShutdown)
}
