package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// claimDueSQL takes over up to $1 due runs of the workflow versions this
// client serves ($4, "name@version"), the longest due first, for owner $2 with a lease of $3
// (takeOverSet, as TakeOver's).
//
// due_at is derived by the database from the lease and the backoff (see
// migration 0003): a run is due when it is unfinished, its lease absent or
// expired and its backoff over. (TakeOver, asked for one run, does not wait
// for the backoff.) SKIP LOCKED lets every
// process poll at once without queueing behind one another or behind an
// executor inside a phase; a row locked here is re-checked against its
// latest version, so a run claimed meanwhile by anyone is not taken twice.
const claimDueSQL = `
WITH due AS (
	SELECT id FROM ratchet.runs
	WHERE due_at <= now() AND workflow || '@' || workflow_version = ANY($4)
	ORDER BY due_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED)
UPDATE ratchet.runs SET ` + takeOverSet + `
WHERE id IN (SELECT id FROM due)
RETURNING ` + runColumns

// ClaimDue takes over, with new lease tokens, up to limit runs that are due:
// unfinished, with no live lease, and past any backoff. Only runs of
// workflow versions registered with this client are claimed: a run of a
// version no live process registers stays due, untouched, until one does.
// Once Shutdown has begun it claims nothing and returns ErrShutdown.
//
// Each returned run is leased to this client and must be passed to
// Continue; a run that is not is taken over by someone else once its lease
// expires. One call is one statement.
func (c *Client) ClaimDue(ctx context.Context, limit int) ([]*Run, error) {
	if limit < 1 {
		return nil, fmt.Errorf("engine: ClaimDue limit %d is less than 1", limit)
	}
	c.mu.Lock()
	draining := c.draining
	c.mu.Unlock()
	if draining {
		return nil, ErrShutdown
	}
	sent := time.Now()
	rows, err := c.pool.Query(ctx, claimDueSQL, limit, c.cfg.ID, c.cfg.StaleAfter, c.workflows.Served())
	if err != nil {
		return nil, fmt.Errorf("engine: claim due runs: %w", notMigrated(err))
	}
	runs, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[Run])
	if err != nil {
		return nil, fmt.Errorf("engine: claim due runs: %w", err)
	}
	for _, run := range runs {
		run.claimSent = sent
		c.countTakeover(ctx, run)
		c.countStarted(run, 1) // a run of a queue, resumed
	}
	return runs, nil
}

// Continue executes a run that ClaimDue or ClaimQueued claimed for this client, from its
// recovery point until it concludes, and returns the run as the execution
// left it. Once Shutdown has begun it executes nothing: it hands the run
// over at once, so that another process continues it without waiting for
// the lease to expire, and returns ErrShutdown.
func (c *Client) Continue(ctx context.Context, run *Run) (*Run, error) {
	if !c.holds(run) {
		return nil, errors.New("engine: Continue needs a run claimed by this client's ClaimDue or ClaimQueued")
	}
	if run.startedHere {
		defer c.countStarted(run, -1)
	}
	done, draining := c.admit()
	defer done()
	if draining {
		return c.handOver(ctx, run)
	}
	return c.continueRun(ctx, run)
}

// holds reports whether run, as claimed, names this client as its lease
// owner.
func (c *Client) holds(run *Run) bool {
	return run != nil && run.LeaseOwner != nil && *run.LeaseOwner == c.cfg.ID
}

// serves reports whether this client registers the version run started on.
func (c *Client) serves(run *Run) bool {
	_, err := c.workflows.lookupVersion(run.Workflow, run.WorkflowVersion)
	return err == nil
}
