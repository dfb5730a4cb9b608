package engine

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ratchet-run/ratchet/steps"
)

var (
	// ErrLeaseLost means another executor took over the run: this one has
	// been superseded and none of its further writes were applied.
	ErrLeaseLost = errors.New("engine: lease lost: run was taken over by another executor")

	// ErrLeaseHeld means a live executor holds the run's lease.
	ErrLeaseHeld = errors.New("engine: run is leased by a live executor")

	// ErrRunNotFound means no run has the given id.
	ErrRunNotFound = errors.New("engine: run not found")

	// ErrUnknownWorkflow means no workflow of that name is registered.
	ErrUnknownWorkflow = errors.New("engine: unknown workflow")

	// ErrUnknownQueue means a workflow or a start names a queue the
	// client's Config.Queues does not declare.
	ErrUnknownQueue = errors.New("engine: unknown queue")

	// ErrInvalidSchedule means a schedule's declaration is not one: a bad
	// cron expression, time zone, interval or policy, an unknown workflow,
	// an input that does not fit it.
	ErrInvalidSchedule = errors.New("engine: invalid schedule")

	// ErrScheduleNotFound means no schedule has the given name.
	ErrScheduleNotFound = errors.New("engine: schedule not found")

	// ErrInvalidKey means an idempotency key is empty, too long or holds
	// characters that are not allowed.
	ErrInvalidKey = errors.New("engine: invalid idempotency key")

	// ErrInvalidInput means a run's input is not JSON that decodes into the
	// workflow's input type.
	ErrInvalidInput = errors.New("engine: invalid input")

	// ErrFingerprintMismatch means the idempotency key is already used by a
	// run with a different workflow or input.
	ErrFingerprintMismatch = errors.New("engine: idempotency key reused with different input")

	// ErrNotInRun means a phase function was called outside a workflow run.
	ErrNotInRun = errors.New("engine: phase called outside a workflow run")

	// ErrCancelled is returned by a phase function of a run whose
	// cancellation was requested: the run stops at this phase boundary.
	// A workflow should return it (wrapped or not).
	ErrCancelled = errors.New("engine: run cancelled")

	// ErrFinished means the run has already finished, so it cannot be
	// cancelled, or reopened unless it failed.
	ErrFinished = errors.New("engine: run already finished")

	// ErrNotFailed means a reopen was asked of a run that has not failed
	// and is not parked for an operator.
	ErrNotFailed = errors.New("engine: run has not failed")

	// ErrPastPivot means a cancellation was asked of a run that has
	// committed its pivot phase: it only goes forward now.
	ErrPastPivot = errors.New("engine: run is past its pivot")

	// ErrNotMigrated means the database lacks Ratchet's tables: apply the
	// migrations (`ratchet migrate`, or migrations.Apply).
	ErrNotMigrated = errors.New("engine: the database is not migrated")

	// ErrInvalidSignal means a signal's name, event id, address or
	// payload cannot be accepted.
	ErrInvalidSignal = errors.New("engine: invalid signal")

	// ErrSignalMismatch means a signal's event id was already used by a
	// signal with another name, address or payload: nothing was stored.
	ErrSignalMismatch = errors.New("engine: signal event id reused with a different signal")

	// ErrNoMatch means a signal that asked for a match (RequireMatch)
	// found no run awaiting it: nothing was stored.
	ErrNoMatch = errors.New("engine: no run awaits this signal")

	// ErrInvalidListParams means a ListRuns filter holds what no run's
	// column can (invalid UTF-8, U+0000) or is out of range.
	ErrInvalidListParams = errors.New("engine: invalid list parameters")

	// ErrExecutionTimeout, as the cause of an execution context's end
	// (context.WithTimeoutCause), stops the execution and releases its run
	// to be retried after backoff, with error code "execution_timeout",
	// where a plain cancellation releases it to be continued at once. The
	// worker bounds the executions it resumes this way.
	ErrExecutionTimeout = errors.New("engine: execution exceeded its time limit")
)

// cancelledError is stored with a cancelled run.
var cancelledError = &RunError{Code: CodeCancelled, Message: "run cancelled"}

// MismatchError reports a key reused with a different request. Nothing was
// executed and the stored run is untouched.
type MismatchError struct {
	RunID string // the run that owns the key
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("engine: idempotency key belongs to run %s, started with a different workflow or input", e.RunID)
}

func (e *MismatchError) Unwrap() error { return ErrFingerprintMismatch }

// LeaseHeldError reports a run leased by a live executor until ExpiresAt
// (by the database's clock), unless that executor heartbeats again.
type LeaseHeldError struct {
	RunID     string
	ExpiresAt time.Time
}

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("engine: run %s is leased by a live executor until %s", e.RunID, e.ExpiresAt.Format(time.RFC3339Nano))
}

func (e *LeaseHeldError) Unwrap() error { return ErrLeaseHeld }

// PastPivotError reports a cancellation refused because the run has
// committed its pivot phase (AtomicOpts.Pivot): it no longer compensates
// and will be carried through.
type PastPivotError struct {
	RunID string
	Pivot string
}

func (e *PastPivotError) Error() string {
	return fmt.Sprintf("engine: run %s is past its pivot %q: it is carried through, not cancelled", e.RunID, e.Pivot)
}

func (e *PastPivotError) Unwrap() error { return ErrPastPivot }

// NonDeterminismError reports workflow code that no longer matches the run's
// journal: at position Seq the journal holds phase Journaled, but the code
// asked for phase Called ("" when the code returned without asking for the
// journaled phase). The run fails; it is never silently rewritten.
type NonDeterminismError struct {
	Seq       int
	Journaled string
	Called    string
}

func (e *NonDeterminismError) Error() string {
	if e.Called == "" {
		return fmt.Sprintf("engine: non-determinism: workflow returned before phase %d, but the journal holds phase %q there", e.Seq, e.Journaled)
	}
	return fmt.Sprintf("engine: non-determinism: phase %d is %q in the journal but the workflow called %q", e.Seq, e.Journaled, e.Called)
}

// Error codes stored in a failed run's error.
const (
	CodeNonDeterminism   = "non_determinism"
	CodeDuplicatePhase   = "duplicate_phase"
	CodeInvalidPhase     = "invalid_phase"
	CodeInternal         = "internal"
	CodePanic            = "panic"
	CodeStepExhausted    = "step_retries_exhausted"
	CodeIndeterminate    = "indeterminate"
	CodeCancelled        = "cancelled"
	CodeExecutionTimeout = "execution_timeout"
	// CodeRetriesExhausted: the run's RetryPolicy gave up (MaxAttempts or
	// MaxElapsed); the message carries the last error.
	CodeRetriesExhausted = "retries_exhausted"
	// CodePhaseIdleTimeout: an atomic phase sat idle in its transaction
	// for longer than StaleAfter, and Postgres ended the session (the
	// zombie guard, docs/engine.md). Do slow work in a step.
	CodePhaseIdleTimeout = "phase_idle_timeout"
	// CodeUndefinedTable: a statement named a table or schema that does
	// not exist: migrations not applied, or the application's own tables
	// not created.
	CodeUndefinedTable = "undefined_table"
)

// RunError is the error stored with a run: the last failure of a run still
// being retried, or the final one of a failed run.
type RunError struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Retryable bool   `json:"retryable"`
}

func (e *RunError) Error() string { return e.Code + ": " + e.Message }

// classify turns what a workflow returned into the error stored with its run.
// Anything not known to be permanent is retryable: a run is never finished
// by accident.
func classify(err error) *RunError {
	var (
		perm *steps.PermanentError
		nd   *NonDeterminismError
		phe  *phaseUsageError
		pe   *panicError
	)
	switch {
	case errors.As(err, &pe):
		return &RunError{Code: CodePanic, Message: pe.Error(), Retryable: true}
	case errors.As(err, &nd):
		return &RunError{Code: CodeNonDeterminism, Message: nd.Error()}
	case errors.As(err, &phe):
		return &RunError{Code: phe.code, Message: phe.Error()}
	case errors.As(err, &perm):
		// The code is the RunError's own: its message is the error's
		// words without it, lest "code: code: ..." be shown.
		msg := err.Error()
		if perm.Err != nil {
			msg = strings.Replace(msg, perm.Error(), perm.Err.Error(), 1)
		}
		return &RunError{Code: perm.Code, Message: msg}
	}
	var (
		status    *steps.StatusError
		exhausted *steps.ExhaustedError
	)
	switch class := steps.Classify(err); {
	case class == steps.ClassPermanent && errors.As(err, &status):
		return &RunError{Code: fmt.Sprintf("http_%d", status.StatusCode), Message: err.Error()}
	case errors.As(err, &exhausted):
		return &RunError{Code: CodeStepExhausted, Message: err.Error(), Retryable: true}
	case class == steps.ClassIndeterminate:
		return &RunError{Code: CodeIndeterminate, Message: err.Error(), Retryable: true}
	}
	return &RunError{Code: CodeInternal, Message: err.Error(), Retryable: true}
}

// runError is classify, with what to do added for the Postgres errors that
// come from a misconfiguration rather than a passing fault: they stay
// retryable (an operator may mend the cause), but say what happened.
func (c *Client) runError(err error) *RunError {
	re := classify(err)
	var pgErr *pgconn.PgError
	if re.Code != CodeInternal || !errors.As(err, &pgErr) {
		return re
	}
	switch pgErr.Code {
	case pgerrcode.IdleInTransactionSessionTimeout:
		re.Code = CodePhaseIdleTimeout
		re.Message = fmt.Sprintf("an atomic phase sat idle in its transaction for longer than stale_after (%s) and Postgres ended its session: "+
			"do slow work (calls, waits) in a step, outside the transaction: %s", c.cfg.StaleAfter, re.Message)
	case pgerrcode.UndefinedTable, pgerrcode.InvalidSchemaName:
		re.Code = CodeUndefinedTable
		re.Message = "a table or schema is missing: apply Ratchet's migrations (ratchet migrate, or migrations.Apply) " +
			"and create the application's own tables: " + re.Message
	}
	return re
}

// phaseUsageError is a programming error in how a workflow names its phases.
// Retrying runs the same code, so it is permanent.
type phaseUsageError struct {
	code string
	msg  string
}

func (e *phaseUsageError) Error() string { return "engine: " + e.msg }
