package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ratchet-run/ratchet/steps"
)

// ChildOpts configure StartChild.
type ChildOpts struct {
	// Queue and Priority place the child in a queue (see StartParams).
	Queue    string
	Priority int
	// Compensate undoes a child that succeeded, when the parent
	// compensates (in the undo's transaction, as an atomic phase's
	// Compensate): start a reversing workflow, say. A child still
	// unfinished when the parent compensates is cancelled instead, and
	// undoes what it did itself. Nil: a finished child is left as it is.
	Compensate func(ctx context.Context, tx pgx.Tx, child *Run) error
}

// childStart is a start_child phase's journaled output.
type childStart struct {
	RunID string `json:"run_id"`
	Key   string `json:"key"`
}

// childResult is an await_child phase's journaled output: how the child
// ended.
type childResult struct {
	RunID  string          `json:"run_id"`
	Status Status          `json:"status"`
	Output json.RawMessage `json:"output,omitempty"`
	Error  *RunError       `json:"error,omitempty"`
}

// ChildError is what AwaitChild returns for a child that did not succeed:
// it failed, was cancelled or compensated. It is permanent (its code is
// the child's error code, or child_<status>): a parent that returns it
// fails, or compensates, rather than awaiting the same outcome again.
type ChildError struct {
	RunID  string
	Status Status
	Err    *RunError // the child's error, if it has one
}

func (e *ChildError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("child run %s %s: %s", e.RunID, e.Status, e.Err.Error())
	}
	return fmt.Sprintf("child run %s %s", e.RunID, e.Status)
}

// Unwrap makes the error permanent, with the child's code.
func (e *ChildError) Unwrap() error {
	code := "child_" + string(e.Status)
	if e.Err != nil && e.Err.Code != "" {
		code = e.Err.Code
	}
	return &steps.PermanentError{Code: code, Err: errors.New(e.Error())}
}

// StartChild is a phase that starts a run of workflow with input, the
// running workflow's child, and returns the child's run id. The child's
// idempotency key is the child key a step of the parent named name would
// send, and the child is created in the phase's transaction: it exists if
// and only if the phase commits, and a parent resumed after a crash finds
// the same child, never a second one. It executes nothing: a worker
// executes the child, and AwaitChild waits for it. Start many, then await
// them, to fan out.
//
// Cancelling the parent cancels its unfinished children, and a parent
// that compensates cancels them (see ChildOpts.Compensate for finished
// ones): the phase's undo. The child workflow must be registered with the
// parent's client.
func StartChild(ctx context.Context, name, workflow string, input any, opts *ChildOpts) (string, error) {
	if opts == nil {
		opts = &ChildOpts{}
	}
	raw, err := json.Marshal(input)
	if err != nil {
		return "", steps.Permanent(CodeInvalidPhase, fmt.Errorf("child %q: encode input: %w", name, err))
	}
	out, err := phase(ctx, name, KindStartChild, func(ctx context.Context, ex *execution, seq int, _ steps.Key) (childStart, error) {
		return runStartChild(ctx, ex, seq, name, workflow, raw, opts)
	}, func(cs childStart) *compensator {
		return &compensator{atomic: func(ctx context.Context, tx pgx.Tx) error { return undoChild(ctx, tx, cs.RunID, opts) }}
	})
	return out.RunID, err
}

func runStartChild(ctx context.Context, ex *execution, seq int, name, workflow string, input []byte, opts *ChildOpts) (childStart, error) {
	var none childStart
	key, err := ex.childKey(name)
	if err != nil {
		return none, err
	}
	tx, err := ex.c.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: ex.c.beginPhase})
	if err != nil {
		return none, fmt.Errorf("engine: phase %q: begin: %w", name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	res, err := ex.c.start(ctx, tx, nil, StartParams{Workflow: workflow, IdempotencyKey: string(key), Input: input, parent: ex.run.ID,
		StartOpts: StartOpts{Tenant: ex.run.Tenant, Queue: opts.Queue, Priority: opts.Priority},
	}, false)
	var mismatch *MismatchError
	switch {
	case errors.Is(err, ErrUnknownWorkflow), errors.Is(err, ErrInvalidInput), errors.Is(err, ErrUnknownQueue), errors.As(err, &mismatch):
		return none, steps.Permanent(CodeInvalidPhase, fmt.Errorf("child %q of workflow %q: %w", name, workflow, err))
	case err != nil:
		return none, err
	}
	out := childStart{RunID: res.Run.ID, Key: string(key)}
	raw, out, err := journaled(name, out)
	if err != nil {
		return none, err
	}
	k := string(key)
	cancel, err := ex.commitPhase(ctx, tx, phaseRecord{seq: seq, name: name, kind: KindStartChild, output: raw, childKey: &k, attempts: 1, compensable: true})
	if err != nil {
		return none, err
	}
	if err := tx.Commit(ctx); err != nil {
		return none, ex.breakOff(fmt.Errorf("engine: phase %q: commit: %w", name, err))
	}
	ex.committed(name, cancel)
	ex.c.ring() // the child is due: this process's worker takes it at once
	return out, nil
}

// undoChild is a start_child phase's undo: the child cancelled if it has
// not finished (it compensates what it did), else, if it succeeded,
// ChildOpts.Compensate; a child that failed or was cancelled has undone
// what it did itself.
func undoChild(ctx context.Context, tx pgx.Tx, childID string, opts *ChildOpts) error {
	ex, err := executionFrom(ctx)
	if err != nil {
		return err
	}
	res, err := ex.c.cancel(ctx, tx, childID)
	var past *PastPivotError
	switch {
	case errors.Is(err, ErrFinished) && opts.Compensate != nil && res.Run.Status == StatusSucceeded:
		return opts.Compensate(ctx, tx, res.Run)
	case errors.Is(err, ErrFinished), errors.As(err, &past), errors.Is(err, ErrRunNotFound):
		return nil // done, carried through, or pruned: nothing to undo here
	}
	return err
}

// AwaitChild is a phase that waits for the child run childID (from
// StartChild) to finish and returns its output decoded into T; a child
// that did not succeed returns a *ChildError. It holds nothing meanwhile:
// the parent is parked (status waiting, blocked reason child) and the
// child's finish wakes it. A run awaited must be a child of the running
// workflow.
func AwaitChild[T any](ctx context.Context, name, childID string) (T, error) {
	var zero T
	out, err := phase(ctx, name, KindAwaitChild, func(ctx context.Context, ex *execution, seq int, _ steps.Key) (childResult, error) {
		return runAwaitChild(ctx, ex, seq, name, childID)
	}, nil)
	if err != nil {
		return zero, err
	}
	if out.Status != StatusSucceeded {
		return zero, &ChildError{RunID: out.RunID, Status: out.Status, Err: out.Error}
	}
	var v T
	if err := json.Unmarshal(out.Output, &v); err != nil {
		return zero, steps.Permanent(CodeInvalidPhase, fmt.Errorf("child run %s: its output does not decode: %w", out.RunID, err))
	}
	return v, nil
}

// Child starts a child run (phase name) and awaits it (phase
// name+".done"): StartChild then AwaitChild.
func Child[T any](ctx context.Context, name, workflow string, input any, opts *ChildOpts) (T, error) {
	id, err := StartChild(ctx, name, workflow, input, opts)
	if err != nil {
		var zero T
		return zero, err
	}
	return AwaitChild[T](ctx, name+".done", id)
}

// childStateSQL reads the child FOR SHARE: a child finishing meanwhile is
// waited for and seen finished, one not yet finishing cannot finish until
// the parent's park commits (and then wakes it).
const childStateSQL = `SELECT status, output, error, finished_at IS NOT NULL, coalesce(parent_run_id, '')
FROM ratchet.runs WHERE id = $1 FOR SHARE`

func runAwaitChild(ctx context.Context, ex *execution, seq int, name, childID string) (childResult, error) {
	var none childResult
	tx, err := ex.c.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: ex.c.beginPhase})
	if err != nil {
		return none, fmt.Errorf("engine: phase %q: begin: %w", name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	res := childResult{RunID: childID}
	var finished bool
	var parent string
	err = tx.QueryRow(ctx, childStateSQL, childID).Scan(&res.Status, &res.Output, &res.Error, &finished, &parent)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return none, steps.Permanent(CodeInvalidPhase, fmt.Errorf("await %q: no run %s (a child is pruned with its retention)", name, childID))
	case err != nil:
		return none, fmt.Errorf("engine: phase %q: read child %s: %w", name, childID, err)
	case parent != ex.run.ID:
		return none, steps.Permanent(CodeInvalidPhase, fmt.Errorf("await %q: run %s is not a child of run %s", name, childID, ex.run.ID))
	case finished:
		return commitWait(ctx, ex, tx, seq, name, KindAwaitChild, res)
	}
	return none, parkIn(ctx, ex, tx, StatusWaiting, &Wait{Kind: KindAwaitChild, Phase: name, Seq: seq, Child: childID})
}

// childrenSQL lists a run's children, oldest first.
const childrenSQL = `SELECT ` + runColumns + ` FROM ratchet.runs WHERE parent_run_id = $1 ORDER BY created_at, id LIMIT $2`

// maxChildren bounds the children Children lists.
const maxChildren = 500

// Children returns the runs runID started with StartChild, oldest first
// (at most 500).
func (c *Client) Children(ctx context.Context, runID string) ([]*Run, error) {
	if err := checkRunID(runID); err != nil {
		return nil, err
	}
	rows, err := c.pool.Query(ctx, childrenSQL, runID, maxChildren)
	if err != nil {
		return nil, fmt.Errorf("engine: children of %s: %w", runID, notMigrated(err))
	}
	runs, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[Run])
	if err != nil {
		return nil, fmt.Errorf("engine: children of %s: %w", runID, err)
	}
	return runs, nil
}
