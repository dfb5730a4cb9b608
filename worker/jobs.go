package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/recovery"
)

// Job kinds.
const (
	KindResume = "ratchet.resume"
	KindSweep  = "ratchet.sweep"
	KindPrune  = "ratchet.prune"
)

// riverSchedulerInterval is how often River's leader moves scheduled jobs
// to available. It is River's fixed default and not configurable, so a
// look due sooner than this is snoozed as "available at" instead, which
// producers fetch at their poll interval.
const riverSchedulerInterval = 5 * time.Second

// resumeArgs schedule a look at one lease of one run. Gen is 0 for the look
// scheduled by the claim; the sweep uses other values to replace a look
// stranded in a dead process.
type resumeArgs struct {
	RunID       string `json:"run_id" river:"unique"`
	Token       int64  `json:"token" river:"unique"`
	Gen         int64  `json:"gen,omitempty" river:"unique"`
	Traceparent string `json:"traceparent,omitempty"`
}

func (resumeArgs) Kind() string { return KindResume }

// uniqueLook makes looks unique per (run, token, gen) among jobs not yet
// completed: River requires the states listed, and leaving out completed
// lets the sweep schedule again a look whose job completed too early.
var uniqueLook = river.UniqueOpts{ByArgs: true, ByState: []rivertype.JobState{
	rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRunning,
	rivertype.JobStateScheduled, rivertype.JobStateRetryable,
}}

// scheduler implements engine.Scheduler with resume jobs.
type scheduler struct {
	river *river.Client[pgx.Tx]
	queue string
}

func (s *scheduler) ScheduleTx(ctx context.Context, tx pgx.Tx, sc engine.Schedule) error {
	_, err := s.river.InsertTx(ctx, tx, resumeArgs{RunID: sc.RunID, Token: sc.LeaseToken, Traceparent: sc.Traceparent}, s.insertOpts(sc.At))
	if err != nil {
		return fmt.Errorf("worker: schedule run %s: %w", sc.RunID, err)
	}
	return nil
}

// insertOpts schedules a look at `at`. River makes a scheduled job available
// only on its scheduler's next pass, so the job is scheduled that much
// earlier; when it runs early it snoozes for the remainder, which producers
// pick up at their poll interval.
func (s *scheduler) insertOpts(at time.Time) *river.InsertOpts {
	opts := &river.InsertOpts{Queue: s.queue, UniqueOpts: uniqueLook, MaxAttempts: 100}
	if early := at.Add(-riverSchedulerInterval); time.Until(early) > 0 {
		opts.ScheduledAt = early
	}
	return opts
}

// snoozeFor turns a wait into a snooze that wakes on time (see insertOpts).
func snoozeFor(wait time.Duration) time.Duration {
	if wait > riverSchedulerInterval {
		return wait - riverSchedulerInterval
	}
	return wait
}

type resumeWorker struct {
	river.WorkerDefaults[resumeArgs]
	rec     *recovery.Recoverer
	timeout time.Duration
}

func (w *resumeWorker) Work(ctx context.Context, job *river.Job[resumeArgs]) error {
	wait, err := w.rec.Look(ctx, job.Args.RunID, job.Args.Token)
	if err != nil {
		return err
	}
	if wait > 0 {
		return river.JobSnooze(snoozeFor(wait))
	}
	return nil
}

// Timeout bounds an execution resumed by the job; River rescues the job
// only after it (see Config.ExecutionTimeout).
func (w *resumeWorker) Timeout(*river.Job[resumeArgs]) time.Duration { return w.timeout }

type sweepArgs struct{}

func (sweepArgs) Kind() string { return KindSweep }

type sweepWorker struct {
	river.WorkerDefaults[sweepArgs]
	w *Worker
}

func (s *sweepWorker) Work(ctx context.Context, _ *river.Job[sweepArgs]) error {
	_, err := s.w.Sweep(ctx)
	return err
}

func (s *sweepWorker) Timeout(*river.Job[sweepArgs]) time.Duration { return time.Minute }

type pruneArgs struct{}

func (pruneArgs) Kind() string { return KindPrune }

type pruneWorker struct {
	river.WorkerDefaults[pruneArgs]
	w *Worker
}

func (p *pruneWorker) Work(ctx context.Context, _ *river.Job[pruneArgs]) error {
	res, err := recovery.Prune(ctx, p.w.pool, &recovery.PruneOpts{BatchSize: p.w.cfg.PruneBatchSize})
	if res.Deleted > 0 {
		p.w.logger.InfoContext(ctx, "pruned expired runs", "runs", res.Deleted, "batches", res.Batches)
	}
	return err
}

func (p *pruneWorker) Timeout(*river.Job[pruneArgs]) time.Duration { return time.Minute }

// orphansSQL finds unfinished runs without a live look at their current
// lease: none scheduled, or only one stuck "running" in a process that died
// while deciding (a look runs for milliseconds unless it takes the run over,
// which replaces the lease). It returns the stuck look's id, if any, so the
// replacement can be told apart from it.
const orphansSQL = `
SELECT r.id, r.lease_token, r.traceparent,
	greatest(coalesce(r.lease_expires_at, now()), coalesce(r.next_attempt_at, now())) AS due,
	stuck.id AS stuck_job
FROM ratchet.runs r
LEFT JOIN LATERAL (
	SELECT j.id FROM ratchet.river_job j
	WHERE j.kind = 'ratchet.resume'
		AND j.args @> jsonb_build_object('run_id', r.id, 'token', r.lease_token)
		AND j.state = 'running' AND j.attempted_at < now() - $2::interval
	ORDER BY j.id DESC LIMIT 1
) stuck ON true
WHERE r.finished_at IS NULL
	AND NOT EXISTS (
		SELECT 1 FROM ratchet.river_job j
		WHERE j.kind = 'ratchet.resume'
			AND j.args @> jsonb_build_object('run_id', r.id, 'token', r.lease_token)
			AND (j.state IN ('available', 'pending', 'scheduled', 'retryable')
				OR (j.state = 'running' AND j.attempted_at >= now() - $2::interval)))
ORDER BY r.id
LIMIT $1`

type orphan struct {
	RunID       string    `db:"id"`
	Token       int64     `db:"lease_token"`
	Traceparent *string   `db:"traceparent"`
	Due         time.Time `db:"due"`
	StuckJob    *int64    `db:"stuck_job"`
}

// Sweep schedules a look for every unfinished run that has none (up to
// Config.SweepBatchSize), and returns how many it scheduled. The leader runs
// it every Config.SweepInterval.
func (w *Worker) Sweep(ctx context.Context) (int, error) {
	rows, err := w.pool.Query(ctx, orphansSQL, w.cfg.SweepBatchSize, w.cfg.StuckLookAfter)
	if err != nil {
		return 0, fmt.Errorf("worker: find runs without a look: %w", err)
	}
	orphans, err := pgx.CollectRows(rows, pgx.RowToStructByName[orphan])
	if err != nil {
		return 0, fmt.Errorf("worker: find runs without a look: %w", err)
	}
	if len(orphans) == 0 {
		return 0, nil
	}
	params := make([]river.InsertManyParams, len(orphans))
	for i, o := range orphans {
		args := resumeArgs{RunID: o.RunID, Token: o.Token}
		if o.StuckJob != nil {
			args.Gen = *o.StuckJob
		}
		if o.Traceparent != nil {
			args.Traceparent = *o.Traceparent
		}
		params[i] = river.InsertManyParams{Args: args, InsertOpts: w.sched.insertOpts(o.Due)}
	}
	res, err := w.river.InsertMany(ctx, params)
	if err != nil {
		return 0, fmt.Errorf("worker: schedule runs without a look: %w", err)
	}
	n := 0
	for _, r := range res {
		if !r.UniqueSkippedAsDuplicate {
			n++
		}
	}
	if n > 0 {
		w.logger.InfoContext(ctx, "swept runs without a scheduled look", "runs", n)
	}
	return n, nil
}
