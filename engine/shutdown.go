package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// ErrShutdown is returned by Start and TakeOver once Shutdown has begun, and
// is the cause with which Shutdown cancels executions that outlast its
// grace: such an execution hands its run over instead of abandoning it.
var ErrShutdown = errors.New("engine: client is shutting down")

// enter admits a Start or TakeOver unless the client is shutting down. The
// returned function must be called when the call returns.
func (c *Client) enter() (done func(), err error) {
	done, draining := c.admit()
	if draining {
		done()
		return nil, ErrShutdown
	}
	return done, nil
}

// admit counts a call that executes runs, so that Shutdown waits for it,
// and reports whether Shutdown has begun: a call admitted while draining
// must start nothing, and hand over any run it already holds. The returned
// function must be called when the call returns.
func (c *Client) admit() (done func(), draining bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.active++
	return c.uncount, c.draining
}

// hold counts one more call that executes runs, as admit does, for a
// caller already admitted: it cannot fail. The returned function must be
// called when the execution ends.
func (c *Client) hold() (done func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.active++
	return c.uncount
}

func (c *Client) uncount() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.active--
	c.closeIdleIfDone()
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
	c.executing.Add(1)
	return func() {
		c.mu.Lock()
		delete(c.executions, ex)
		c.executing.Add(-1)
		c.mu.Unlock()
	}
}

// closeIdleIfDone closes idle once Shutdown has begun and nothing is
// active. c.mu must be held.
func (c *Client) closeIdleIfDone() {
	if c.draining && c.active == 0 && !c.idleClosed {
		close(c.idle)
		c.idleClosed = true
	}
}

// handOverWait bounds the hand-over after Shutdown's grace: the release
// statement of each run, and Shutdown's wait for them.
const handOverWait = time.Second

// Shutdown stops the client from starting or resuming runs and waits for
// executions in progress to conclude. When ctx ends first (its deadline is
// the grace period), the remaining executions are stopped at once and hand
// their runs over: each releases its lease with a new token, which makes
// the run due now, so another executor continues it without waiting for
// the lease to go stale. Shutdown returns when every execution has
// concluded, or at most a second after ctx ends, with an error naming the
// executions that had not (their runs are resumed once their leases
// expire). It may be called more than once, from any goroutine.
func (c *Client) Shutdown(ctx context.Context) error {
	c.mu.Lock()
	if !c.draining {
		c.draining = true
		c.idle = make(chan struct{})
		c.closeIdleIfDone()
	}
	idle := c.idle
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
	if n > 0 {
		c.logger.Info("shutting down: handing over runs still executing", slog.Int("runs", n))
	}
	select {
	case <-idle:
		return nil
	case <-time.After(handOverWait):
	}
	c.mu.Lock()
	left := len(c.executions)
	c.mu.Unlock()
	return fmt.Errorf("engine: shutdown: %d executions still running a second after the grace; their runs resume when their leases expire: %w", left, ctx.Err())
}

// handOverSQL releases a run held by this client and gives it a new token,
// so that a zombie of the lease it held is fenced. The run is due at once.
const handOverSQL = `
UPDATE ratchet.runs SET
	lease_token = lease_token + 1,
	lease_owner = NULL,
	lease_expires_at = NULL,
	status = ` + releasedStatus + `,
	updated_at = now()
WHERE id = $1 AND lease_token = $2 AND finished_at IS NULL
RETURNING ` + runColumns

// handOver releases a run this client holds (as claimed, in run) because
// the client is shutting down. It returns the released run with an error
// wrapping ErrShutdown, or ErrLeaseLost if the lease was no longer ours.
func (c *Client) handOver(ctx context.Context, run *Run) (*Run, error) {
	released, err := c.release(ctx, run, "handed run over for another executor")
	if err != nil {
		return nil, err
	}
	return released, fmt.Errorf("engine: run %s handed over: %w", run.ID, ErrShutdown)
}

// release gives up this client's lease on run (as claimed) with a new
// token, so that the run is due at once, and logs why. It returns
// ErrLeaseLost if the lease was no longer ours.
func (c *Client) release(ctx context.Context, run *Run, why string) (*Run, error) {
	// The caller's context may be cancelled; the release gets a moment of
	// its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handOverWait)
	defer cancel()
	released, ok, err := queryRun(ctx, c.pool, handOverSQL, run.ID, run.LeaseToken)
	if err != nil {
		return nil, fmt.Errorf("engine: release run %s: %w", run.ID, err)
	}
	if !ok {
		return nil, fmt.Errorf("engine: run %s: %w", run.ID, ErrLeaseLost)
	}
	c.logger.InfoContext(ctx, why, slog.String("run_id", run.ID),
		slog.Int64("lease_token", released.LeaseToken), slog.String("recovery_point", released.RecoveryPoint))
	return released, nil
}
