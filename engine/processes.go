package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Process is a live process, as it announced itself: the workflow
// versions it serves ("name@version"), and until when it is presumed
// alive (by the database's clock) unless it announces itself again.
type Process struct {
	ID          string    `db:"id"`
	Serves      []string  `db:"serves"`
	StartedAt   time.Time `db:"started_at"`
	HeartbeatAt time.Time `db:"heartbeat_at"`
	ExpiresAt   time.Time `db:"expires_at"`
}

// announceSQL upserts this process's row, and drops the rows of processes
// that died more than an hour ago (the table stays as small as the fleet).
const announceSQL = `
WITH gone AS (DELETE FROM ratchet.processes WHERE expires_at < now() - interval '1 hour' AND id <> $1)
INSERT INTO ratchet.processes (id, serves, expires_at) VALUES ($1, $2, now() + $3::interval)
ON CONFLICT (id) DO UPDATE SET serves = excluded.serves, heartbeat_at = now(), expires_at = excluded.expires_at`

// Announce records that this client (by its ID) serves its registry's
// workflow versions, until ttl from now. A process that takes due runs
// announces itself every few seconds — recovery.Recoverer does — so that
// "who can run this?" has an answer (Processes). One statement.
func (c *Client) Announce(ctx context.Context, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("engine: Announce ttl %s is not positive", ttl)
	}
	if _, err := c.pool.Exec(ctx, announceSQL, c.cfg.ID, c.workflows.Served(), ttl); err != nil {
		return fmt.Errorf("engine: announce: %w", notMigrated(err))
	}
	return nil
}

// Withdraw removes this client's announcement: it serves nothing any more.
func (c *Client) Withdraw(ctx context.Context) error {
	if _, err := c.pool.Exec(ctx, `DELETE FROM ratchet.processes WHERE id = $1`, c.cfg.ID); err != nil {
		return fmt.Errorf("engine: withdraw: %w", notMigrated(err))
	}
	return nil
}

const processesSQL = `SELECT id, serves, started_at, heartbeat_at, expires_at FROM ratchet.processes
WHERE expires_at > now() ORDER BY id`

// Processes lists the live processes (their announcements not yet
// expired) and what they serve.
func (c *Client) Processes(ctx context.Context) ([]Process, error) {
	rows, err := c.pool.Query(ctx, processesSQL)
	if err != nil {
		return nil, fmt.Errorf("engine: processes: %w", notMigrated(err))
	}
	ps, err := pgx.CollectRows(rows, pgx.RowToStructByName[Process])
	if err != nil {
		return nil, fmt.Errorf("engine: processes: %w", err)
	}
	return ps, nil
}

const servedSQL = `SELECT EXISTS (SELECT 1 FROM ratchet.processes WHERE expires_at > now() AND $1 = ANY(serves))`

// Served reports whether a live process serves the version run started
// on; when none does, the run waits — due, untouched — until one does.
func (c *Client) Served(ctx context.Context, run *Run) (bool, error) {
	var ok bool
	if err := c.pool.QueryRow(ctx, servedSQL, served(run.Workflow, run.WorkflowVersion)).Scan(&ok); err != nil {
		return false, fmt.Errorf("engine: served: %w", notMigrated(err))
	}
	return ok, nil
}
