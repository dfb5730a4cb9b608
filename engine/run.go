package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/oklog/ulid/v2"

	"github.com/ratchet-run/ratchet/internal/schema"
	"github.com/ratchet-run/ratchet/steps"
)

// Status is a run's state.
type Status string

const (
	StatusPending Status = "pending" // not yet claimed, or released to be retried
	StatusRunning Status = "running" // claimed by an executor (whose lease may have expired)
	StatusWaiting Status = "waiting" // parked until a time, a signal or an operator
	// StatusCompensating: failed permanently or cancelled before its
	// pivot, the run is undoing its compensable phases, newest first.
	StatusCompensating Status = "compensating"
	StatusSucceeded    Status = "succeeded" // finished with an output
	StatusFailed       Status = "failed"    // finished with a permanent error
	StatusCancelled    Status = "cancelled" // finished by cancellation
	// StatusCompensated: finished with every compensable phase undone;
	// its error is the cause (the failure, or the cancellation), its
	// output lists what was undone.
	StatusCompensated Status = "compensated"
)

// The statuses of a run in flight, and the terminal ones.
var (
	unfinishedStatuses = []Status{StatusPending, StatusRunning, StatusWaiting, StatusCompensating}
	finishedStatuses   = []Status{StatusSucceeded, StatusFailed, StatusCancelled, StatusCompensated}
)

// Finished reports whether s is a terminal status.
func (s Status) Finished() bool {
	return slices.Contains(finishedStatuses, s)
}

// Run is a snapshot of one run's row.
type Run struct {
	ID              string          `db:"id"`
	Tenant          string          `db:"tenant"`
	IdempotencyKey  string          `db:"idempotency_key"`
	Workflow        string          `db:"workflow"`
	WorkflowVersion int             `db:"workflow_version"`
	Input           json.RawMessage `db:"input"`
	Fingerprint     []byte          `db:"fingerprint"`
	Status          Status          `db:"status"`
	// RecoveryPoint names the last committed phase, or "started".
	RecoveryPoint  string     `db:"recovery_point"`
	LeaseOwner     *string    `db:"lease_owner"`
	LeaseToken     int64      `db:"lease_token"`
	LeaseExpiresAt *time.Time `db:"lease_expires_at"`
	// Attempt counts executions: it grows by one on every claim, a wake
	// from a sleep, a signal or a child, and a claim that finds the key's
	// slot taken, included.
	Attempt int `db:"attempt"`
	// Failures counts the executions that failed: ended in a retryable
	// error, or were lost (their lease expired with them, in a crash or a
	// lost connection), and the one that failed the run; since the run's
	// creation, or since Reopen. RetryPolicy.MaxAttempts bounds it.
	Failures       int             `db:"failures"`
	NextAttemptAt  *time.Time      `db:"next_attempt_at"`
	Output         json.RawMessage `db:"output"`
	Error          *RunError       `db:"error"`
	ResponseStatus *int            `db:"response_status"`
	Traceparent    *string         `db:"traceparent"`
	CreatedAt      time.Time       `db:"created_at"`
	UpdatedAt      time.Time       `db:"updated_at"`
	FinishedAt     *time.Time      `db:"finished_at"`
	ExpiresAt      *time.Time      `db:"expires_at"`
	// CancelRequestedAt is set when a cancellation was asked of the run
	// while an executor held it.
	CancelRequestedAt *time.Time `db:"cancel_requested_at"`
	// DueAt is when the run is next due for an executor, derived by the
	// database from the lease and the backoff: the lease's expiry, the end
	// of the backoff, or, for a run nobody holds, when it was last changed.
	// Nil once the run has finished. A worker in any process takes over a
	// run whose DueAt has passed (see ClaimDue).
	DueAt *time.Time `db:"due_at"`
	// WaitingFor says what a parked run waits for (its status is then
	// waiting): the phase, and the time it wakes at.
	WaitingFor *Wait `db:"waiting_for"`
	// Pivot names the run's pivot phase once it has committed: from then
	// on the run no longer compensates, and a cancellation is refused.
	Pivot *string `db:"pivot"`
	// ErrorStreak counts the retryable failures in a row with the same
	// error (code and message) as Error.
	ErrorStreak int `db:"error_streak"`
	// KeyFormat is the format of the child keys the run's steps send
	// (1: steps.ChildKey, 2: steps.ChildKeyV2), fixed at its creation.
	KeyFormat int `db:"key_format"`
	// ConcurrencyKey is the key whose slots the run executes in (see
	// Concurrency), with its group, and ConcurrencyLimit how many of them
	// there were when it was created; nil for a run without one.
	ConcurrencyKey   *string `db:"concurrency_key"`
	ConcurrencyLimit *int    `db:"concurrency_limit"`
	// HoldsSlot is set while the run holds one of its key's slots: from
	// the moment it takes one, before anything of it executes, until it
	// finishes (or parks, releasing it).
	HoldsSlot bool `db:"holds_slot"`
	// Queue is the queue the run waits in or started from (see Queue),
	// Priority its place there (higher first), and QueueStartedAt when it
	// left it; nil for a run in no queue, or one still waiting.
	Queue          *string    `db:"queue"`
	Priority       int        `db:"priority"`
	QueueStartedAt *time.Time `db:"queue_started_at"`
	// ParentRunID is the run whose StartChild phase started this one.
	ParentRunID *string `db:"parent_run_id"`
	// Blocked says what an unfinished run waits for and what will move
	// it. Set by GetRun's siblings that read it (Why, ListRuns); nil
	// elsewhere and for a finished run.
	Blocked *Blocked `db:"-"`

	// claimSent is when, by this process's clock, the statement that
	// claimed the run for this client was sent (zero for a run read
	// otherwise): a time before the database's now() that the lease's
	// expiry counts from, so the executor's own bound on its lease (see
	// heartbeat) is never later than the database's.
	claimSent time.Time
	// startedHere marks a run this client started from its queue, counted
	// among the queue's runs executing here until its execution ends.
	startedHere bool
}

// Wait describes what a run is parked for.
type Wait struct {
	// Kind is the waiting phase's kind: KindSleep or KindSignal, or, for a
	// run parked for an operator, KindCompensation (a compensation failed
	// permanently) or KindReconcile (a step's outcome is unknown and may
	// be past the downstream's key window).
	Kind PhaseKind `json:"kind"`
	// Phase is the waiting phase's name, and Seq its place in the journal.
	Phase string `json:"phase"`
	Seq   int    `json:"seq"`
	// Until is when the run wakes, by the database's clock: a sleep's end,
	// or an Await's timeout. Nil for an Await without one.
	Until *time.Time `json:"until,omitempty"`
	// Signal is the signal an Await waits for, and CorrelationKey the key
	// it matches besides the run's own id.
	Signal         string `json:"signal,omitempty"`
	CorrelationKey string `json:"correlation_key,omitempty"`
	// Reason says, for a run parked for an operator, what happened and
	// what to do; Error is the failure that parked it, if any.
	Reason string    `json:"reason,omitempty"`
	Error  *RunError `json:"error,omitempty"`
	// ChildKey is the parked step's child key; FirstAttempt the earliest
	// moment it may first have been sent, by the database's clock; and
	// KeyWindow how long its downstream remembers keys (KindReconcile).
	ChildKey     string        `json:"child_key,omitempty"`
	FirstAttempt *time.Time    `json:"first_attempt,omitempty"`
	KeyWindow    time.Duration `json:"key_window,omitempty"`
	// Key is the concurrency key a run queued for a slot waits on
	// (KindConcurrency), and Resume what it waited for before, restored
	// when a slot passes to it.
	Key    string `json:"key,omitempty"`
	Resume *Wait  `json:"resume,omitempty"`
	// Queue is the queue a run waits in before it starts (KindQueue).
	Queue string `json:"queue,omitempty"`
	// Child is the child run an AwaitChild waits for (KindAwaitChild).
	Child string `json:"child,omitempty"`
	// Resolved is set by Reopen: an operator has seen the parked phase and
	// asks for it to be tried again (a compensation) or called again (a
	// step past its key window).
	Resolved bool `json:"resolved,omitempty"`
}

// runColumns lists Run's columns in the order of its fields.
const runColumns = `id, tenant, idempotency_key, workflow, workflow_version, input, fingerprint,
	status, recovery_point, lease_owner, lease_token, lease_expires_at, attempt, next_attempt_at,
	output, error, response_status, traceparent, created_at, updated_at, finished_at, expires_at,
	cancel_requested_at, due_at, waiting_for, pivot, error_streak, key_format,
	concurrency_key, concurrency_limit, holds_slot, queue, priority, queue_started_at, parent_run_id, failures`

// dbtx is what both a pool and a transaction offer.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// queryRun runs a statement returning runColumns and yields the run, or
// ok=false when it returned no row.
func queryRun(ctx context.Context, db dbtx, sql string, args ...any) (run *Run, ok bool, err error) {
	rows, err := db.Query(ctx, sql, args...)
	if err == nil {
		run, ok, err = collectRun(rows)
	}
	if err != nil {
		return nil, false, notMigrated(err)
	}
	return run, ok, nil
}

// collectRun reads a statement's one row of runColumns, or ok=false when
// it returned none.
func collectRun(rows pgx.Rows) (run *Run, ok bool, err error) {
	run, err = pgx.CollectExactlyOneRow(rows, pgx.RowToAddrOfStructByName[Run])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	return run, err == nil, err
}

// notMigrated turns a missing table or schema, met by one of the engine's
// own statements (they touch Ratchet's schema only), into ErrNotMigrated
// with the fix, instead of Postgres's words alone on every call.
func notMigrated(err error) error {
	return schema.NotMigrated(err, ErrNotMigrated)
}

// leasedRun is a run together with whether its lease was live when read,
// judged by the database's clock.
type leasedRun struct {
	Run
	LeaseLive bool      `db:"lease_live"`
	DBNow     time.Time `db:"db_now"`
}

// leaseColumns follow runColumns in leasedRun queries.
const leaseColumns = `coalesce(lease_expires_at > now(), false) AS lease_live, now() AS db_now`

const getRunSQL = `SELECT ` + runColumns + `, ` + leaseColumns + ` FROM ratchet.runs WHERE id = $1`

// GetRun returns the run with the given id, or ErrRunNotFound.
func (c *Client) GetRun(ctx context.Context, id string) (*Run, error) {
	lr, err := getRun(ctx, c.pool, id)
	if err != nil {
		return nil, err
	}
	return &lr.Run, nil
}

// checkRunID refuses, as not found, an id that no run can have (run ids
// are ULIDs), before it reaches SQL: a NUL byte or invalid UTF-8 would make
// Postgres raise an error instead of finding nothing.
func checkRunID(id string) error {
	if _, err := ulid.ParseStrict(id); err != nil {
		return fmt.Errorf("%w: %q", ErrRunNotFound, id)
	}
	return nil
}

func getRun(ctx context.Context, db dbtx, id string) (*leasedRun, error) {
	if err := checkRunID(id); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, getRunSQL, id)
	if err != nil {
		return nil, fmt.Errorf("engine: get run: %w", notMigrated(err))
	}
	lr, err := pgx.CollectExactlyOneRow(rows, pgx.RowToAddrOfStructByName[leasedRun])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s", ErrRunNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("engine: get run: %w", err)
	}
	return lr, nil
}

// PhaseKind says how a phase executes.
type PhaseKind string

const (
	KindAtomic PhaseKind = "atomic" // runs in the transaction that commits it
	KindStep   PhaseKind = "step"   // runs outside any transaction, then commits its result
	KindSleep  PhaseKind = "sleep"  // parks the run until a time, then commits
	KindSignal PhaseKind = "signal" // parks the run until a signal or a timeout, then commits it
	// KindCompensation: the decision to compensate ("undo", its output
	// the cause) and each undo of a compensable phase ("undo:<name>").
	KindCompensation PhaseKind = "compensation"
	// KindReconcile is never journaled: it is the Wait.Kind of a run
	// parked because a step must be reconciled by an operator.
	KindReconcile PhaseKind = "reconcile"
	// KindPatch marks a run that took a patched path (Patched).
	KindPatch PhaseKind = "patch"
	// KindStartChild starts a child run (StartChild); KindAwaitChild
	// parks the run until a child finishes, then commits how it ended.
	KindStartChild PhaseKind = "start_child"
	KindAwaitChild PhaseKind = "await_child"
	// KindConcurrency is never journaled: it is the Wait.Kind of a run
	// queued for a slot of its concurrency key.
	KindConcurrency PhaseKind = "concurrency"
	// KindQueue is no phase either: the wait of a run in its queue, before
	// it starts.
	KindQueue PhaseKind = "queue"
)

// Phase is one committed entry of a run's journal.
type Phase struct {
	RunID      string          `db:"run_id"`
	Seq        int             `db:"seq"`
	Name       string          `db:"name"`
	Kind       PhaseKind       `db:"kind"`
	Output     json.RawMessage `db:"output"`
	ChildKey   *string         `db:"child_key"`
	Attempts   int             `db:"attempts"`
	Error      *RunError       `db:"error"`
	StartedAt  time.Time       `db:"started_at"`
	FinishedAt time.Time       `db:"finished_at"`
	// Compensable is set when the phase committed with an undo
	// registered (StepOpts.Compensate, AtomicOpts.Compensate).
	Compensable bool `db:"compensable"`
	// Execution is the run's attempt (Run.Attempt) that committed the
	// phase; every later execution replayed it from the journal. Zero for
	// a phase committed before Ratchet recorded it.
	Execution int `db:"execution"`
}

// phaseColumns are what a Phase is read from.
const phaseColumns = `run_id, seq, name, kind, output, child_key, attempts, error, started_at, finished_at, compensable,
	coalesce(execution, 0) AS execution`

const listPhasesSQL = `SELECT ` + phaseColumns + `
FROM ratchet.phases WHERE run_id = $1 ORDER BY seq`

// Phases returns a run's journal in order.
func (c *Client) Phases(ctx context.Context, runID string) ([]Phase, error) {
	return listPhases(ctx, c.pool, runID)
}

func listPhases(ctx context.Context, db dbtx, runID string) ([]Phase, error) {
	if err := checkRunID(runID); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, listPhasesSQL, runID)
	if err != nil {
		return nil, fmt.Errorf("engine: list phases: %w", notMigrated(err))
	}
	phases, err := pgx.CollectRows(rows, pgx.RowToStructByName[Phase])
	if err != nil {
		return nil, fmt.Errorf("engine: list phases: %w", err)
	}
	return phases, nil
}

// ChildKey is the child idempotency key the run's step (or undo, or
// child) named phase sends downstream, in the run's key format
// (KeyFormat): what a test, or an operator checking a downstream, looks
// the call up by.
func (r *Run) ChildKey(phase string) (steps.Key, error) {
	switch r.KeyFormat {
	case 3:
		return steps.ChildKeyV3(r.Tenant, r.IdempotencyKey, phase), nil
	case 2:
		key, err := steps.ChildKeyV2(r.Tenant, r.ID, phase)
		if err != nil {
			return "", fmt.Errorf("engine: run %s: child key of %s: %w", r.ID, phase, err)
		}
		return key, nil
	default:
		return steps.ChildKey(r.Tenant, r.ID, phase), nil
	}
}
