package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// BlockedReason says what an unfinished run waits for (Blocked.Reason).
type BlockedReason string

// The reasons, in the order they are decided: the first that holds is the
// run's.
const (
	// BlockedCompensationStuck: an undo failed permanently; an operator
	// must mend its cause and resume the run.
	BlockedCompensationStuck BlockedReason = "compensation_stuck"
	// BlockedNeedsReconciliation: a step's outcome is unknown past its
	// downstream's key window; an operator must check the downstream and
	// resume or cancel the run.
	BlockedNeedsReconciliation BlockedReason = "needs_reconciliation"
	// BlockedConcurrency: the run is queued for a slot of its concurrency
	// key (ConcurrencyKey), whose Limit slots other runs hold (Holders);
	// it starts when one passes to it, in creation order.
	BlockedConcurrency BlockedReason = "concurrency"
	// BlockedQueued: the run waits in its queue (Queue, at Priority) for
	// room: it starts when fewer of the queue's runs execute than its
	// concurrency, after the runs ahead of it (Why counts them).
	BlockedQueued BlockedReason = "queued"
	// BlockedRateLimited: the run waits in its queue, whose rate limit
	// has been reached; the next start is at Until (Why says it).
	BlockedRateLimited BlockedReason = "rate_limited"
	// BlockedCompensating: the run is undoing its compensable phases.
	BlockedCompensating BlockedReason = "compensating"
	// BlockedCancelPending: a cancellation was asked; the run stops at its
	// next phase boundary.
	BlockedCancelPending BlockedReason = "cancel_pending"
	// BlockedExecuting: a live executor holds the run (Owner, Until: its
	// lease).
	BlockedExecuting BlockedReason = "executing"
	// BlockedTimer: the run sleeps until Until.
	BlockedTimer BlockedReason = "timer"
	// BlockedChild: the run awaits a child run (Child) to finish.
	BlockedChild BlockedReason = "child"
	// BlockedSignal: the run awaits a signal (Signal, CorrelationKey;
	// Until its timeout, if any).
	BlockedSignal BlockedReason = "signal"
	// BlockedUnserved: the run needs an executor and no live process
	// serves its workflow version.
	BlockedUnserved BlockedReason = "unserved"
	// BlockedBackingOff: the run failed retryably and is retried at Until;
	// Error is the last failure, Streak how many times in a row.
	BlockedBackingOff BlockedReason = "backing_off"
	// BlockedDue: the run is due (Since) and no one has taken it: a
	// symptom of no live worker, or of workers with no free slot.
	BlockedDue BlockedReason = "due"
)

// BlockedReasons returns every reason, in the order they are decided.
func BlockedReasons() []BlockedReason {
	return []BlockedReason{
		BlockedCompensationStuck, BlockedNeedsReconciliation, BlockedConcurrency, BlockedQueued, BlockedRateLimited, BlockedCompensating, BlockedCancelPending,
		BlockedExecuting, BlockedTimer, BlockedChild, BlockedSignal, BlockedUnserved, BlockedBackingOff, BlockedDue,
	}
}

// blockedReasonSQL decides a run's blocked reason from its row (alias r),
// by the database's clock: the one place it is decided, for Why, for the
// reason ListRuns shows and filters by, and for the gauges. NULL for a
// finished run.
const blockedReasonSQL = `(CASE
	WHEN r.finished_at IS NOT NULL THEN NULL
	WHEN r.waiting_for->>'kind' = 'compensation' AND r.lease_expires_at IS NULL AND r.next_attempt_at IS NULL THEN 'compensation_stuck'
	WHEN r.waiting_for->>'kind' = 'reconcile' AND r.lease_expires_at IS NULL AND r.next_attempt_at IS NULL THEN 'needs_reconciliation'
	WHEN r.waiting_for->>'kind' = 'concurrency' AND r.lease_expires_at IS NULL AND r.next_attempt_at IS NULL THEN 'concurrency'
	WHEN r.waiting_for->>'kind' = 'queue' AND r.lease_expires_at IS NULL AND r.next_attempt_at IS NULL THEN
		CASE WHEN EXISTS (SELECT 1 FROM ratchet.queues q WHERE q.name = r.queue AND q.limited_until > now()) THEN 'rate_limited' ELSE 'queued' END
	WHEN r.status = 'compensating' THEN 'compensating'
	WHEN r.cancel_requested_at IS NOT NULL THEN 'cancel_pending'
	WHEN r.lease_expires_at > now() THEN 'executing'
	WHEN r.status = 'waiting' AND r.waiting_for->>'kind' = 'sleep' AND r.next_attempt_at > now() THEN 'timer'
	WHEN r.status = 'waiting' AND r.waiting_for->>'kind' = 'await_child' AND r.next_attempt_at IS NULL THEN 'child'
	WHEN r.status = 'waiting' AND r.waiting_for->>'kind' = 'signal' AND (r.next_attempt_at IS NULL OR r.next_attempt_at > now()) THEN 'signal'
	WHEN NOT EXISTS (SELECT 1 FROM ratchet.processes p
		WHERE p.expires_at > now() AND r.workflow || '@' || r.workflow_version = ANY(p.serves)) THEN 'unserved'
	WHEN r.next_attempt_at > now() THEN 'backing_off'
	ELSE 'due'
END)`

// Blocked is what an unfinished run waits for, and what will move it.
type Blocked struct {
	Reason BlockedReason `json:"reason"`
	// Detail says it in a sentence, with what will move the run.
	Detail string `json:"detail"`
	// Since is when the run entered this state, as far as its row tells;
	// Until when it ends by itself (a lease's expiry, a wake time, a
	// timeout, the end of a backoff), if it does.
	Since *time.Time `json:"since,omitempty"`
	Until *time.Time `json:"until,omitempty"`
	// Owner is the executor holding the run (executing, compensating).
	Owner string `json:"owner,omitempty"`
	// Phase is the phase the run is parked at (timer, signal, stuck,
	// reconciliation); Signal and CorrelationKey what it awaits; ChildKey
	// the key of a step to reconcile.
	Phase          string `json:"phase,omitempty"`
	Signal         string `json:"signal,omitempty"`
	CorrelationKey string `json:"correlation_key,omitempty"`
	ChildKey       string `json:"child_key,omitempty"`
	// Error is the last failure (backing off) or the one that parked the
	// run (stuck); Streak how many retryable failures in a row had it.
	Error  *RunError `json:"error,omitempty"`
	Streak int       `json:"streak,omitempty"`
	// ConcurrencyKey is the key a queued run waits for a slot of, Limit
	// how many it has, and Holders the runs holding them (Why lists them;
	// a listing does not).
	ConcurrencyKey string   `json:"concurrency_key,omitempty"`
	Limit          int      `json:"limit,omitempty"`
	Holders        []string `json:"holders,omitempty"`
	// Queue is the queue a run waits in, Priority its place there, and
	// QueueState what Why read of the queue (a listing does not).
	// Child is the child run a parent awaits.
	Child      string      `json:"child,omitempty"`
	Queue      string      `json:"queue,omitempty"`
	Priority   int         `json:"priority,omitempty"`
	QueueState *QueueState `json:"queue_state,omitempty"`
}

// describe fills in a Blocked from the run's row, for the reason the
// database decided.
func describe(run *Run, reason BlockedReason) *Blocked {
	b := &Blocked{Reason: reason, Since: &run.UpdatedAt}
	w := run.WaitingFor
	if w == nil {
		w = &Wait{}
	}
	owner := ""
	if run.LeaseOwner != nil {
		owner = *run.LeaseOwner
	}
	switch reason {
	case BlockedCompensationStuck:
		b.Phase, b.ChildKey, b.Error = w.Phase, w.ChildKey, w.Error
		b.Detail = fmt.Sprintf("compensation %s failed permanently; %s", w.Phase, w.Reason)
	case BlockedNeedsReconciliation:
		b.Phase, b.ChildKey, b.Since = w.Phase, w.ChildKey, w.FirstAttempt
		b.Detail = fmt.Sprintf("step %s (child key %s) may have reached its downstream more than its key window (%s) ago; %s", w.Phase, w.ChildKey, w.KeyWindow, w.Reason)
	case BlockedConcurrency:
		b.ConcurrencyKey = w.Key
		if run.ConcurrencyLimit != nil {
			b.Limit = *run.ConcurrencyLimit
		}
		b.Detail = fmt.Sprintf("queued for a slot of concurrency key %q (limit %d): it starts when a run of the key that holds one finishes or parks, in creation order", w.Key, b.Limit)
	case BlockedQueued, BlockedRateLimited:
		b.Queue, b.Priority = w.Queue, run.Priority
		b.Detail = fmt.Sprintf("waiting in queue %q (priority %d) to start: when the queue has room, highest priority first, then in creation order", w.Queue, run.Priority)
		if reason == BlockedRateLimited {
			b.Detail = fmt.Sprintf("waiting in queue %q (priority %d), whose rate limit is reached: it starts once the limit allows, highest priority first", w.Queue, run.Priority)
		}
	case BlockedCompensating:
		b.Owner, b.Until, b.Error, b.Streak = owner, cmpTime(run.LeaseExpiresAt, run.NextAttemptAt), run.Error, run.ErrorStreak
		b.Detail = "undoing its compensable phases, newest first"
		if owner != "" && run.LeaseExpiresAt != nil && run.LeaseExpiresAt.After(time.Now()) {
			b.Detail += " on " + owner
		} else if run.NextAttemptAt != nil {
			b.Detail += fmt.Sprintf("; an undo failed (%s) and is retried at %s", codeOf(run.Error), run.NextAttemptAt.UTC().Format(time.RFC3339))
		}
	case BlockedCancelPending:
		b.Since = run.CancelRequestedAt
		b.Owner = owner
		b.Detail = "a cancellation was asked; the run stops at its next phase boundary, when an executor gets to it"
	case BlockedExecuting:
		b.Owner, b.Until = owner, run.LeaseExpiresAt
		b.Detail = fmt.Sprintf("executing on %s; its lease runs until %s and is renewed while it lives", owner, run.LeaseExpiresAt.UTC().Format(time.RFC3339))
	case BlockedTimer:
		// The wake time is next_attempt_at (the database decided by it);
		// waiting_for repeats it.
		b.Phase, b.Until = w.Phase, cmp.Or(run.NextAttemptAt, w.Until)
		b.Detail = fmt.Sprintf("sleeping at %s until %s", w.Phase, b.Until.UTC().Format(time.RFC3339))
	case BlockedChild:
		b.Phase, b.Child = w.Phase, w.Child
		b.Detail = fmt.Sprintf("awaiting child run %s at %s: its finish wakes this run", w.Child, w.Phase)
	case BlockedSignal:
		b.Phase, b.Signal, b.CorrelationKey, b.Until = w.Phase, w.Signal, w.CorrelationKey, w.Until
		b.Detail = fmt.Sprintf("awaiting signal %q", w.Signal)
		if w.CorrelationKey != "" {
			b.Detail += fmt.Sprintf(" with correlation key %q", w.CorrelationKey)
		}
		if w.Until != nil {
			b.Detail += "; it times out at " + w.Until.UTC().Format(time.RFC3339)
		}
	case BlockedUnserved:
		if run.DueAt != nil && run.DueAt.Before(time.Now()) {
			b.Since = run.DueAt // due, and nobody can take it
		}
		b.Detail = fmt.Sprintf("no live process runs %s: it waits until one that registers it starts", served(run.Workflow, run.WorkflowVersion))
	case BlockedBackingOff:
		b.Until, b.Error, b.Streak = run.NextAttemptAt, run.Error, run.ErrorStreak
		b.Detail = fmt.Sprintf("failed retryably (%s, %d time(s) in a row); retried at %s", codeOf(run.Error), run.ErrorStreak, run.NextAttemptAt.UTC().Format(time.RFC3339))
	case BlockedDue:
		b.Since = run.DueAt
		b.Detail = "due, and no worker has taken it: are workers running, with free slots?"
	}
	return b
}

func codeOf(e *RunError) string {
	if e == nil {
		return "no error recorded"
	}
	return e.Code
}

func cmpTime(ts ...*time.Time) *time.Time {
	for _, t := range ts {
		if t != nil {
			return t
		}
	}
	return nil
}

// viewedRun is a run read with its blocked reason.
type viewedRun struct {
	Run
	BlockedReason *BlockedReason `db:"blocked_reason"`
}

func (v *viewedRun) run() *Run {
	if v.BlockedReason != nil {
		v.Run.Blocked = describe(&v.Run, *v.BlockedReason)
	}
	return &v.Run
}

const whySQL = `SELECT ` + runColumns + `, ` + blockedReasonSQL + ` AS blocked_reason FROM ratchet.runs r WHERE id = $1`

// Why returns the run with its Blocked set: what it waits for and what
// will move it (nil once it has finished). Unknown ids return
// ErrRunNotFound.
func (c *Client) Why(ctx context.Context, runID string) (*Run, error) {
	if err := checkRunID(runID); err != nil {
		return nil, err
	}
	rows, err := c.pool.Query(ctx, whySQL, runID)
	if err != nil {
		return nil, fmt.Errorf("engine: why: %w", notMigrated(err))
	}
	v, err := pgx.CollectExactlyOneRow(rows, pgx.RowToAddrOfStructByName[viewedRun])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s", ErrRunNotFound, runID)
	}
	if err != nil {
		return nil, fmt.Errorf("engine: why: %w", err)
	}
	run := v.run()
	switch b := run.Blocked; {
	case b == nil:
	case b.Reason == BlockedConcurrency:
		if b.Holders, err = c.slotHolders(ctx, run); err != nil {
			return nil, err
		}
	case b.Reason == BlockedQueued || b.Reason == BlockedRateLimited:
		if b.QueueState, err = c.queueState(ctx, run); err != nil {
			return nil, err
		}
		if b.Reason == BlockedRateLimited {
			b.Until = b.QueueState.LimitedUntil
			if b.Until != nil {
				b.Detail += "; the next start is at " + b.Until.UTC().Format(time.RFC3339Nano)
			}
		}
		s := b.QueueState
		if s.RateLimit > 0 {
			b.Detail += fmt.Sprintf("; its rate limit is %d starts in %s", s.RateLimit, s.RatePeriod)
		}
		if s.Concurrency > 0 {
			b.Detail += fmt.Sprintf("; %d of its %d running, %d waiting ahead of this run", s.Executing, s.Concurrency, s.Ahead)
		} else {
			b.Detail += fmt.Sprintf("; %d running, %d waiting ahead of this run", s.Executing, s.Ahead)
		}
	}
	return run, nil
}

// maxHolders bounds the holders Why lists.
const maxHolders = 20

const slotHoldersSQL = `SELECT id FROM ratchet.runs
WHERE tenant = $1 AND concurrency_key = $2 AND finished_at IS NULL AND holds_slot
ORDER BY created_at, id LIMIT $3`

// slotHolders lists the runs holding slots of a queued run's key, oldest
// first.
func (c *Client) slotHolders(ctx context.Context, run *Run) ([]string, error) {
	rows, err := c.pool.Query(ctx, slotHoldersSQL, run.Tenant, *run.ConcurrencyKey, maxHolders)
	if err != nil {
		return nil, fmt.Errorf("engine: why: slot holders: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("engine: why: slot holders: %w", err)
	}
	return ids, nil
}

// blockedCountsSQL counts the unfinished runs by blocked reason, and says
// how long the longest-due untaken run has waited and the longest streak
// of one retryable error: what the gauges report.
const blockedCountsSQL = `SELECT ` + blockedReasonSQL + ` AS reason, count(*),
	coalesce(extract(epoch FROM now() - min(r.due_at) FILTER (WHERE r.due_at <= now() AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= now()))), 0),
	coalesce(max(r.error_streak) FILTER (WHERE r.next_attempt_at > now()), 0)
FROM ratchet.runs r WHERE r.finished_at IS NULL GROUP BY 1`

// RunsSummary is what BlockedSummary counts over every unfinished run.
type RunsSummary struct {
	// ByReason counts the runs by blocked reason.
	ByReason map[BlockedReason]int
	// OldestDue is how long the longest-due run nobody holds has been
	// due: zero when none is.
	OldestDue time.Duration
	// LongestStreak is the longest run of one retryable error among the
	// runs backing off.
	LongestStreak int
}

// BlockedSummary counts the unfinished runs by blocked reason, for
// dashboards and alerts (the worker reports it as gauges).
func (c *Client) BlockedSummary(ctx context.Context) (*RunsSummary, error) {
	rows, err := c.pool.Query(ctx, blockedCountsSQL)
	if err != nil {
		return nil, fmt.Errorf("engine: blocked summary: %w", notMigrated(err))
	}
	defer rows.Close()
	s := &RunsSummary{ByReason: map[BlockedReason]int{}}
	for rows.Next() {
		var reason BlockedReason
		var n, streak int
		var oldest float64
		if err := rows.Scan(&reason, &n, &oldest, &streak); err != nil {
			return nil, fmt.Errorf("engine: blocked summary: %w", err)
		}
		s.ByReason[reason] = n
		s.OldestDue = max(s.OldestDue, time.Duration(oldest*float64(time.Second)))
		s.LongestStreak = max(s.LongestStreak, streak)
	}
	return s, rows.Err()
}
