package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/ratchet-run/ratchet/steps"
)

// cancelSQL cancels an unfinished run. One nobody holds (no lease, or an
// expired one) with nothing to undo is cancelled at once, with a new token
// so that a zombie of its last executor is fenced. One with committed
// phases to undo is marked and made due at once (new token, lease
// released): an executor replays it, registering its undos, and
// compensates. One a live executor holds is marked, and the executor stops
// at its next phase boundary (and compensates, if it has undos by then).
// One already compensating is only marked: it is undoing what it did, on
// its own schedule (a stuck one waits for Reopen). A run past its pivot
// is not touched.
const cancelSQL = `
UPDATE ratchet.runs r SET
	cancel_requested_at = coalesce(r.cancel_requested_at, now()),
	status        = CASE WHEN s.at_once THEN 'cancelled' ELSE r.status END,
	error         = CASE WHEN s.at_once THEN $2::jsonb ELSE r.error END,
	finished_at   = CASE WHEN s.at_once THEN now() END,
	expires_at    = CASE WHEN s.at_once THEN now() + $3::interval END,
	lease_token   = CASE WHEN s.held OR s.compensating THEN r.lease_token ELSE r.lease_token + 1 END,
	lease_owner   = CASE WHEN s.held OR s.compensating THEN r.lease_owner END,
	lease_expires_at = CASE WHEN s.held OR s.compensating THEN r.lease_expires_at END,
	next_attempt_at  = CASE WHEN s.held OR s.compensating THEN r.next_attempt_at WHEN s.at_once THEN NULL ELSE now() END,
	updated_at = now()
FROM (
	SELECT held, compensating, compensating OR undos AS compensates, NOT held AND NOT compensating AND NOT undos AS at_once FROM (
		SELECT coalesce(lease_expires_at > now(), false) AS held, status = 'compensating' AS compensating,
			EXISTS (SELECT 1 FROM ratchet.phases WHERE run_id = $1 AND compensable) AS undos
		FROM ratchet.runs WHERE id = $1 AND pivot IS NULL FOR UPDATE) locked
) s
WHERE r.id = $1 AND r.finished_at IS NULL AND r.pivot IS NULL
RETURNING ` + runColumns + `, s.held, s.compensates`

// CancelOutcome says what a cancellation does.
type CancelOutcome string

const (
	// CancelledNow: nobody held the run and it had nothing to undo; it
	// is cancelled.
	CancelledNow CancelOutcome = "cancelled"
	// CancelCompensates: the run has committed phases with undos; an
	// executor takes it at once, undoes them, newest first, and finishes
	// it compensated.
	CancelCompensates CancelOutcome = "compensates"
	// CancelRequested: a live executor holds the run; it stops at its
	// next phase boundary and compensates whatever has committed with an
	// undo by then (a step in flight commits its result first), else
	// finishes the run cancelled.
	CancelRequested CancelOutcome = "requested"
)

// CancelResult is the run a cancellation left, and what it will do.
type CancelResult struct {
	Run     *Run
	Outcome CancelOutcome
}

// cancelledRun is cancelSQL's row.
type cancelledRun struct {
	Run
	Held        bool `db:"held"`
	Compensates bool `db:"compensates"`
}

// Cancel cancels an unfinished run: at once if no live executor holds it
// and it has nothing to undo; by compensating if it has committed phases
// with undos (see CancelOutcome); else at the executor's next phase
// boundary. Phases already committed stay committed. A run past its pivot
// returns a *PastPivotError (ErrPastPivot), a finished run ErrFinished, an
// unknown id ErrRunNotFound.
func (c *Client) Cancel(ctx context.Context, runID string) (*CancelResult, error) {
	return c.cancel(ctx, c.pool, runID)
}

// CancelTx cancels a run as Cancel does, in the caller's transaction: the
// cancellation holds if and only if tx commits, together with the
// caller's own writes (an order marked cancelled, say).
func (c *Client) CancelTx(ctx context.Context, tx pgx.Tx, runID string) (*CancelResult, error) {
	if tx == nil {
		return nil, errors.New("engine: CancelTx: nil transaction")
	}
	return c.cancel(ctx, tx, runID)
}

func (c *Client) cancel(ctx context.Context, db dbtx, runID string) (*CancelResult, error) {
	lr, err := getRun(ctx, db, runID)
	if err != nil {
		return nil, err
	}
	if lr.Status.Finished() {
		return &CancelResult{Run: &lr.Run}, fmt.Errorf("%w: %s is %s", ErrFinished, runID, lr.Status)
	}
	var ttl *time.Duration
	if def, err := c.workflows.lookupVersion(lr.Workflow, lr.WorkflowVersion); err == nil {
		ttl = def.ttl(StatusCancelled)
	}
	rows, err := db.Query(ctx, cancelSQL, runID, cancelledError, ttl)
	if err != nil {
		return nil, fmt.Errorf("engine: cancel run %s: %w", runID, notMigrated(err))
	}
	cr, err := pgx.CollectExactlyOneRow(rows, pgx.RowToAddrOfStructByName[cancelledRun])
	if errors.Is(err, pgx.ErrNoRows) { // finished meanwhile, or past its pivot
		lr, err := getRun(ctx, db, runID)
		switch {
		case err != nil:
			return nil, err
		case lr.Status.Finished():
			return &CancelResult{Run: &lr.Run}, fmt.Errorf("%w: %s is %s", ErrFinished, runID, lr.Status)
		case lr.Pivot != nil:
			return &CancelResult{Run: &lr.Run}, &PastPivotError{RunID: runID, Pivot: *lr.Pivot}
		}
		return nil, fmt.Errorf("engine: cancel run %s: the run changed while being cancelled", runID)
	}
	if err != nil {
		return nil, fmt.Errorf("engine: cancel run %s: %w", runID, err)
	}
	res := &CancelResult{Run: &cr.Run, Outcome: CancelRequested}
	switch {
	case cr.Run.Status.Finished():
		res.Outcome = CancelledNow
	case cr.Compensates && (!cr.Held || cr.Run.Status == StatusCompensating):
		res.Outcome = CancelCompensates
	}
	return res, nil
}

// resumeParkedSQL makes a run parked for an operator due at once, its wait
// marked resolved: the parked phase is tried again (a compensation) or
// called again (a step past its key window).
const resumeParkedSQL = `
UPDATE ratchet.runs SET
	waiting_for = waiting_for || '{"resolved": true}',
	next_attempt_at = now(),
	lease_token = lease_token + 1,
	updated_at = now()
WHERE id = $1 AND finished_at IS NULL AND lease_expires_at IS NULL
	AND waiting_for->>'kind' IN ('compensation', 'reconcile')
RETURNING ` + runColumns

// reopenSQL reopens a failed run from its recovery point, with a new token.
const reopenSQL = `
UPDATE ratchet.runs SET
	status = 'pending',
	recovery_point = coalesce((SELECT name FROM ratchet.phases WHERE run_id = $1 ORDER BY seq DESC LIMIT 1), 'started'),
	output = NULL,
	response_status = NULL,
	finished_at = NULL,
	expires_at = NULL,
	next_attempt_at = NULL,
	cancel_requested_at = NULL,
	failures = 0,
	lease_token = lease_token + 1,
	updated_at = now()
WHERE id = $1 AND status = 'failed'
RETURNING ` + runColumns

// dropFailedPhaseSQL removes the journal's last phase if it records a
// permanent failure, so that the reopened run tries it again.
const dropFailedPhaseSQL = `
DELETE FROM ratchet.phases
WHERE run_id = $1 AND error IS NOT NULL
	AND seq = (SELECT max(seq) FROM ratchet.phases WHERE run_id = $1)`

// Reopen retries a failed run from its recovery point, or resumes a run
// parked for an operator. A failed run becomes
// pending again and due at once (keeping its last error until it finishes
// anew), with its failures counted afresh: its retry policy's MaxAttempts
// is a new round. If the journal's last phase is the
// step whose permanent failure failed the run, it is removed so that the
// step is tried again — with the same child key, so a downstream that
// stored its answer gives it again. Committed phases are not repeated.
//
// A run parked for an operator (Wait.Kind KindCompensation or
// KindReconcile) becomes due at once, its wait marked resolved: the
// compensation that failed permanently is tried again, or the step whose
// outcome only reconciliation could tell is called again with its key —
// the operator having checked that its effect did not happen.
//
// Any other run returns ErrNotFailed.
func (c *Client) Reopen(ctx context.Context, runID string) (*Run, error) {
	return c.reopen(ctx, c.pool, runID)
}

// ReopenTx reopens a failed run as Reopen does, in the caller's
// transaction: the run is reopened, and due, if and only if tx commits.
func (c *Client) ReopenTx(ctx context.Context, tx pgx.Tx, runID string) (*Run, error) {
	if tx == nil {
		return nil, errors.New("engine: ReopenTx: nil transaction")
	}
	return c.reopen(ctx, tx, runID)
}

// reopen runs in a transaction of its own on db, or a savepoint when db is
// the caller's transaction.
func (c *Client) reopen(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, runID string) (*Run, error) {
	if err := checkRunID(runID); err != nil {
		return nil, err
	}
	var run *Run
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var status Status
		err := tx.QueryRow(ctx, `SELECT status FROM ratchet.runs WHERE id = $1 FOR UPDATE`, runID).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %s", ErrRunNotFound, runID)
		}
		if err != nil {
			return err
		}
		if status != StatusFailed {
			var ok bool
			run, ok, err = queryRun(ctx, tx, resumeParkedSQL, runID)
			if err == nil && !ok {
				err = fmt.Errorf("%w: %s is %s and not parked for an operator", ErrNotFailed, runID, status)
			}
			return err
		}
		if _, err := tx.Exec(ctx, dropFailedPhaseSQL, runID); err != nil {
			return err
		}
		run, _, err = queryRun(ctx, tx, reopenSQL, runID)
		return err
	})
	if err != nil {
		if errors.Is(err, ErrRunNotFound) || errors.Is(err, ErrNotFailed) {
			return nil, err
		}
		return nil, fmt.Errorf("engine: reopen run %s: %w", runID, err)
	}
	return run, nil
}

// ListParams filter and page ListRuns. Empty fields do not filter.
type ListParams struct {
	Tenant         string // defaults to "default"
	Workflow       string
	Status         Status
	IdempotencyKey string
	// ChildKey finds the run whose step sent this child key downstream.
	ChildKey string
	// Blocked keeps the unfinished runs blocked for this reason.
	Blocked BlockedReason
	// After continues a listing: runs older than this id. Runs are listed
	// newest first, by id, so rows inserted meanwhile neither shift nor
	// repeat the pages.
	After string
	// Limit bounds the page. Defaults to 50; at most 500.
	Limit int
}

// listRunsSQL writes the statement for one shape of listing: only the
// filters that are set appear in it, so that every shape has its own
// statement text, its own prepared statement and its own plan. One
// statement for all shapes, with "($n = ” OR col = $n)" guards, plans
// well for the values of its first calls only: Postgres switches a
// prepared statement to a generic plan after five executions, and the
// generic plan of that statement walked the whole primary key for any
// filter (docs/performance.md has the figures).
//
// Each shape is answered from an index that yields runs newest first
// (migration 0010, which says why ids are compared under the "C"
// collation here): an idempotency key from the request-digest unique
// index, a child key from the phases' child-key index, a blocked reason
// or an unfinished status from the index of unfinished runs, a finished
// status (and a workflow) from the partial indexes of finished runs; a
// listing without a status reads the unfinished runs and the finished
// runs of each status apart and merges the pages.
func listRunsSQL(p *ListParams) (string, []any) {
	args := []any{p.Tenant}
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	var where []string
	where = append(where, "r.tenant = $1")
	if p.IdempotencyKey != "" {
		key := arg(p.IdempotencyKey)
		where = append(where, "ratchet.request_digest(r.tenant, r.idempotency_key) = ratchet.request_digest($1, "+key+")",
			"r.idempotency_key = "+key)
	}
	if run, ok := steps.Key(p.ChildKey).Run(); ok {
		// A key of format 2 names its run: its journal is read, no index of
		// every key sent.
		runArg := arg(run)
		where = append(where, "r.id = "+runArg,
			"EXISTS (SELECT 1 FROM ratchet.phases ph WHERE ph.run_id = "+runArg+" AND ph.child_key = "+arg(p.ChildKey)+")")
	} else if digest, ok := steps.Key(p.ChildKey).Digest(); ok {
		// A key of format 3 names its request: the run is found by the
		// request's digest (runs_request_unique), then its journal read.
		where = append(where, "ratchet.request_digest(r.tenant, r.idempotency_key) = "+arg(digest),
			"EXISTS (SELECT 1 FROM ratchet.phases ph WHERE ph.run_id = r.id AND ph.child_key = "+arg(p.ChildKey)+")")
	} else if p.ChildKey != "" {
		// The index of every key sent holds keys of format 1 only
		// (migration 0012); the clause that says so lets the planner use
		// it. The runs are looked up by the ids it yields (an InitPlan run
		// once), whatever else filters them.
		where = append(where, "r.id = ANY (ARRAY(SELECT ph.run_id FROM ratchet.phases ph WHERE ph.child_key = "+arg(p.ChildKey)+
			` AND ph.child_key LIKE 'rk1\_%'))`)
	}
	if p.Status != "" {
		where = append(where, "r.status = "+arg(string(p.Status)))
	}
	if p.After != "" {
		where = append(where, `r.id COLLATE "C" < `+arg(p.After))
	}
	if p.Blocked != "" {
		where = append(where, blockedReasonSQL+" = "+arg(string(p.Blocked)))
	}
	limit := arg(p.Limit)
	var workflow string
	if p.Workflow != "" {
		workflow = "r.workflow = " + arg(p.Workflow)
	}
	page := func(conds ...string) string {
		return `SELECT ` + runColumns + ` FROM ratchet.runs r
WHERE ` + strings.Join(slices.DeleteFunc(append(slices.Clone(where), conds...), func(s string) bool { return s == "" }), "\n\tAND ") + `
ORDER BY r.id COLLATE "C" DESC LIMIT ` + limit
	}
	var body string
	switch {
	case p.IdempotencyKey != "" || p.ChildKey != "":
		body = page(workflow) // a run or a few, found by their key
	case p.Blocked != "" || (p.Status != "" && !p.Status.Finished()):
		body = page(workflow, "r.finished_at IS NULL")
	case p.Status != "":
		body = page(workflow, "r.finished_at IS NOT NULL")
	default:
		// The unfinished runs, and the finished runs of each status (by
		// workflow too, if one is asked), each range read newest first,
		// merged.
		branches := []string{page(workflow, "r.finished_at IS NULL")}
		for _, st := range finishedStatuses {
			branches = append(branches, page(workflow, "r.finished_at IS NOT NULL", "r.status = '"+string(st)+"'"))
		}
		body = `SELECT * FROM ((` + strings.Join(branches, ")\nUNION ALL\n(") + `)) u
ORDER BY u.id COLLATE "C" DESC LIMIT ` + limit
	}
	// The blocked reason is computed for the page's rows only.
	return `SELECT r.*, ` + blockedReasonSQL + ` AS blocked_reason FROM (` + body + `) r
ORDER BY r.id COLLATE "C" DESC`, args
}

// ListRuns returns a page of the tenant's runs, newest first, each
// unfinished one with its Blocked set.
func (c *Client) ListRuns(ctx context.Context, p ListParams) ([]Run, error) {
	if p.Tenant == "" {
		p.Tenant = DefaultTenant
	}
	switch {
	case p.Limit == 0:
		p.Limit = 50
	case p.Limit < 0 || p.Limit > 500:
		return nil, fmt.Errorf("%w: limit %d outside 1..500", ErrInvalidListParams, p.Limit)
	}
	for _, f := range []struct{ name, value string }{
		{"tenant", p.Tenant}, {"workflow", p.Workflow}, {"status", string(p.Status)},
		{"idempotency_key", p.IdempotencyKey}, {"child_key", p.ChildKey}, {"after", p.After}, {"blocked", string(p.Blocked)},
	} {
		if !utf8.ValidString(f.value) || strings.ContainsRune(f.value, 0) {
			return nil, fmt.Errorf("%w: %s is not valid UTF-8 text without U+0000", ErrInvalidListParams, f.name)
		}
	}
	if p.Status != "" && !p.Status.Finished() && !slices.Contains(unfinishedStatuses, p.Status) {
		return nil, fmt.Errorf("%w: status must be one of %v", ErrInvalidListParams, append(slices.Clone(unfinishedStatuses), finishedStatuses...))
	}
	if p.Blocked != "" && !slices.Contains(BlockedReasons(), p.Blocked) {
		return nil, fmt.Errorf("%w: blocked must be one of %v", ErrInvalidListParams, BlockedReasons())
	}
	if p.Blocked != "" && p.Status.Finished() {
		return nil, nil // only an unfinished run is blocked
	}
	sql, args := listRunsSQL(&p)
	rows, err := c.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("engine: list runs: %w", notMigrated(err))
	}
	viewed, err := pgx.CollectRows(rows, pgx.RowToStructByName[viewedRun])
	if err != nil {
		return nil, fmt.Errorf("engine: list runs: %w", err)
	}
	runs := make([]Run, len(viewed))
	for i := range viewed {
		runs[i] = *viewed[i].run()
	}
	return runs, nil
}
