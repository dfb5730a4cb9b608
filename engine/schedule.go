package engine

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Scheduler arranges for a run to be looked at again, so that a run whose
// executor dies is resumed without any client asking. The worker package
// implements it with River jobs; the engine declares it so as to depend on
// no queue.
//
// The engine calls ScheduleTx in the transaction that creates or claims a
// run, so a schedule exists if and only if the claim commits.
type Scheduler interface {
	ScheduleTx(ctx context.Context, tx pgx.Tx, s Schedule) error
}

// Schedule asks for the run to be looked at when At comes.
type Schedule struct {
	RunID string
	// LeaseToken is the run's token after the claim: the schedule concerns
	// this lease, and is moot once another claim replaces it.
	LeaseToken int64
	// At is when to look: the lease's expiry, or now for an unleased run.
	At time.Time
	// Traceparent of the request that created the run, if any.
	Traceparent string
}

// claim runs a claiming statement (one that returns runColumns) and, when a
// scheduler is configured and the statement returned a run, schedules a look
// at it in the same transaction: tx when given, else a new one. Without a
// scheduler the statement runs alone, in one round trip.
func (c *Client) claim(ctx context.Context, tx pgx.Tx, sql string, args ...any) (*Run, bool, error) {
	if c.cfg.Scheduler == nil {
		var db dbtx = c.pool
		if tx != nil {
			db = tx
		}
		return queryRun(ctx, db, sql, args...)
	}
	var (
		run *Run
		ok  bool
	)
	do := func(tx pgx.Tx) error {
		var err error
		run, ok, err = queryRun(ctx, tx, sql, args...)
		if err != nil || !ok {
			return err
		}
		return c.cfg.Scheduler.ScheduleTx(ctx, tx, scheduleFor(run))
	}
	var err error
	if tx != nil {
		err = do(tx)
	} else {
		err = pgx.BeginFunc(ctx, c.pool, do)
	}
	if err != nil {
		return nil, false, err
	}
	return run, ok, nil
}

// scheduleFor returns when a just-claimed run should be looked at: when its
// lease expires, or, if it has none, now (its updated_at, by the database's
// clock).
func scheduleFor(run *Run) Schedule {
	s := Schedule{RunID: run.ID, LeaseToken: run.LeaseToken, At: run.UpdatedAt}
	if run.LeaseExpiresAt != nil {
		s.At = *run.LeaseExpiresAt
	}
	if run.NextAttemptAt != nil && run.NextAttemptAt.After(s.At) {
		s.At = *run.NextAttemptAt
	}
	if run.Traceparent != nil {
		s.Traceparent = *run.Traceparent
	}
	return s
}
