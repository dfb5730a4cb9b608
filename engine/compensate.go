package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	"github.com/ratchet-run/ratchet/internal/crashpoint"
	"github.com/ratchet-run/ratchet/steps"
)

// The phases a compensation journals: undoPhase records the decision and
// its cause; undoPrefix + name records the undo of the phase name.
// Workflows may not name their own phases so.
const (
	undoPhase  = "undo"
	undoPrefix = "undo:"
)

func reservedPhaseName(name string) bool {
	return name == undoPhase || strings.HasPrefix(name, undoPrefix) || isPatchMarker(name)
}

// errCompensating stops the workflow of a run resumed to compensate at the
// first phase past its journal: the replay has registered every undo.
var errCompensating = errors.New("engine: the run is compensating: it goes no further forward")

// compensator is an undo registered by a phase that committed: a step's,
// called with a child key of its own, or an atomic phase's, run in a
// transaction.
type compensator struct {
	phase string // the phase it undoes
	step  func(ctx context.Context, key steps.Key) error
	// policy and timeout are the step's (nil, 0: the client's).
	policy  *steps.Policy
	timeout time.Duration
	atomic  func(ctx context.Context, tx pgx.Tx) error
}

// undoStart is the journaled output of the undo phase.
type undoStart struct {
	Cause *RunError `json:"cause"`
}

// Compensation is a compensated run's output: the phases undone, in the
// order they were undone (newest first).
type Compensation struct {
	Compensated []string `json:"compensated"`
}

// register records phase name's undo, unless the run has passed its pivot.
func (ex *execution) register(name string, c *compensator) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.pivoted {
		return
	}
	c.phase = name
	ex.undos = append(ex.undos, c)
}

// passPivot records that the run's pivot committed: it never compensates.
func (ex *execution) passPivot() {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.pivoted = true
	ex.undos = nil
}

// splitJournal separates a journal's forward phases, which the workflow
// replays, from its compensation phases (which follow them all). It
// returns the cause of a compensation the journal records, if any.
func splitJournal(journal []Phase) (forward []Phase, undone map[string]bool, cause *RunError) {
	undone = map[string]bool{}
	for i, p := range journal {
		if p.Kind != KindCompensation {
			continue
		}
		if forward == nil {
			forward = journal[:i:i]
		}
		undone[p.Name] = true
		if p.Name == undoPhase {
			var start undoStart
			if err := json.Unmarshal(p.Output, &start); err == nil {
				cause = start.Cause
			}
		}
	}
	if forward == nil {
		forward = journal
	}
	return forward, undone, cause
}

// compensationCause says whether the execution, its workflow having
// returned err, is to compensate, and for what cause: a run resumed while
// compensating, a cancellation, a permanent failure (but a
// non-determinism: the code no longer matches the journal it would undo),
// or a retry policy that gives up — each only before the pivot and with an
// undo registered. Anything that ended the execution itself (a lost lease,
// a shutdown, a park, a commit of unknown outcome) is not a cause.
func (c *Client) compensationCause(ctx context.Context, ex *execution, err error) *RunError {
	if ctx.Err() != nil {
		return nil
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	switch {
	case ex.parked != nil, ex.broken != nil:
		return nil
	case ex.compensating:
		return cmpOr(ex.cause, ex.run.Error, &RunError{Code: CodeInternal, Message: "compensating"})
	case ex.pivoted || len(ex.undos) == 0:
		return nil
	case ex.stopped:
		return cancelledError
	case ex.fatal != nil:
		var nd *NonDeterminismError
		if errors.As(ex.fatal, &nd) {
			return nil
		}
		return classify(ex.fatal)
	case err == nil:
		return nil
	}
	runErr := c.runError(err)
	if !runErr.Retryable {
		return runErr
	}
	if _, givesUp := c.retryDecision(ex, err); givesUp {
		return exhausted(ex.run.Failures+1, runErr)
	}
	return nil
}

func cmpOr(errs ...*RunError) *RunError {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// beginCompensationSQL records the decision to compensate, fenced: the run
// becomes compensating with the cause as its error, and the undo phase
// journals the cause. Refused past the pivot.
const beginCompensationSQL = `
WITH advanced AS (
	UPDATE ratchet.runs SET status = 'compensating', error = $5, recovery_point = $3, waiting_for = NULL, updated_at = now()
	WHERE id = $1 AND lease_token = $2 AND finished_at IS NULL AND pivot IS NULL
	RETURNING id, attempt
)
INSERT INTO ratchet.phases (run_id, seq, name, kind, output, attempts, started_at, finished_at, execution)
SELECT id, $4, $3, 'compensation', $6, 1, now(), clock_timestamp(), attempt FROM advanced`

// compensate undoes the run's compensable phases, newest first, each as
// its own journaled phase. It returns nil when all are undone (conclude
// then finishes the run compensated), the park's error when an undo
// failed permanently, or the error that ended it otherwise (retried).
func (c *Client) compensate(ctx context.Context, ex *execution, cause *RunError) error {
	// A step result the execution holds is journaled first: its undo is
	// among those to run, and a resumed compensation finds it there.
	if err := ex.flush(ctx); err != nil {
		return err
	}
	ex.mu.Lock()
	begun, undos := ex.compensating, append([]*compensator(nil), ex.undos...)
	ex.mu.Unlock()
	if !begun {
		raw, err := json.Marshal(undoStart{Cause: cause})
		if err != nil {
			return err
		}
		seq := ex.takeSeq()
		_, end := ex.hooks.Phase(ctx, ex.phaseInfo(undoPhase, KindCompensation, seq, false, ""))
		tag, err := c.pool.Exec(ctx, beginCompensationSQL, ex.run.ID, ex.run.LeaseToken, undoPhase, seq, cause, raw)
		switch {
		case err != nil:
			err = ex.breakOff(fmt.Errorf("engine: begin compensation: %w", notMigrated(err)))
		case tag.RowsAffected() == 0:
			err = ex.leaseLost(ctx)
		}
		end(err)
		if err != nil {
			return err
		}
		ex.mu.Lock()
		ex.compensating, ex.cause = true, cause
		ex.mu.Unlock()
		if err := ex.crashAfter(ctx, undoPhase); err != nil {
			return err
		}
		c.tel.compensations.Add(ctx, 1, metric.WithAttributes(attrWorkflow.String(ex.run.Workflow), attrOutcome.String("begun")))
		c.logger.InfoContext(ctx, "compensating", slog.String("run_id", ex.run.ID),
			slog.String("cause", cause.Code), slog.Int("undos", len(undos)))
	}

	registered := map[string]bool{}
	for _, u := range undos {
		registered[u.phase] = true
	}
	for _, p := range ex.journal {
		if p.Compensable && !registered[p.Name] && !ex.undone[undoPrefix+p.Name] {
			// The journal says this phase registered an undo, and this
			// build's code did not register one on replay.
			return c.parkForOperator(ctx, ex, StatusCompensating, &Wait{Kind: KindCompensation, Phase: undoPrefix + p.Name, Seq: ex.takeSeq(),
				Reason: fmt.Sprintf("phase %q committed with an undo, but this build registers none for it: deploy code that does, then resume the run", p.Name)})
		}
	}
	for i := len(undos) - 1; i >= 0; i-- {
		if err := c.undo(ctx, ex, undos[i]); err != nil {
			return err
		}
	}
	return nil
}

// undo runs one compensation as the phase "undo:<name>", unless the
// journal holds it.
func (c *Client) undo(ctx context.Context, ex *execution, u *compensator) error {
	name := undoPrefix + u.phase
	ex.mu.Lock()
	done := ex.undone[name]
	ex.mu.Unlock()
	if done {
		return nil
	}
	var key steps.Key
	if u.step != nil {
		var err error
		if key, err = ex.childKey(name); err != nil {
			return err
		}
	}
	seq := ex.takeSeq()
	ctx, end := ex.hooks.Phase(ctx, ex.phaseInfo(name, KindCompensation, seq, false, string(key)))
	var err error
	if u.step != nil {
		err = c.undoStep(ctx, ex, u, seq, name, key)
	} else {
		err = c.undoAtomic(ctx, ex, u, seq, name)
	}
	end(err)
	switch {
	case err == nil:
		ex.mu.Lock()
		ex.undone[name] = true
		ex.mu.Unlock()
		return ex.crashAfter(ctx, name)
	case ctx.Err() != nil:
		return err
	case steps.Classify(err) == steps.ClassPermanent:
		c.tel.compensations.Add(ctx, 1, metric.WithAttributes(attrWorkflow.String(ex.run.Workflow), attrOutcome.String("stuck")))
		re := classify(err)
		return c.parkForOperator(ctx, ex, StatusCompensating, &Wait{Kind: KindCompensation, Phase: name, Seq: seq, ChildKey: string(key), Error: re,
			Reason: "the compensation failed permanently: mend its cause (the downstream, the data), then resume the run to try it again"})
	}
	return err
}

func (c *Client) undoStep(ctx context.Context, ex *execution, u *compensator, seq int, name string, key steps.Key) error {
	policy, timeout := c.cfg.StepPolicy, cmp.Or(u.timeout, c.cfg.StepTimeout)
	if u.policy != nil {
		policy = *u.policy
	}
	started := time.Now()
	attempts, err := policy.Do(ctx, nil, func(ctx context.Context, attempt int) error {
		actx, cancel := context.WithTimeout(steps.WithKey(ctx, key), timeout)
		defer cancel()
		err := u.step(actx, key)
		if err != nil && errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			err = &steps.IndeterminateError{Err: fmt.Errorf("compensation timed out after %s: %w", timeout, err)}
		}
		if err != nil {
			c.logger.InfoContext(ctx, "compensation attempt failed", slog.String("run_id", ex.run.ID), slog.String("phase", name),
				slog.Int("attempt", attempt), slog.String("error", err.Error()))
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("engine: %s: %w", name, err)
	}
	// The undo has happened: commit it even if the execution is being
	// stopped, as a step's result is.
	commitCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stepCommitTimeout)
	defer cancel()
	_, err = ex.commitPhase(commitCtx, nil, phaseRecord{seq: seq, name: name, kind: KindCompensation, output: []byte("null"),
		childKey: (*string)(&key), attempts: attempts, startedAt: &started})
	return err
}

func (c *Client) undoAtomic(ctx context.Context, ex *execution, u *compensator, seq int, name string) error {
	tx, err := c.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: c.beginPhase})
	if err != nil {
		return fmt.Errorf("engine: %s: begin: %w", name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if err := u.atomic(ctx, tx); err != nil {
		return fmt.Errorf("engine: %s: %w", name, err)
	}
	if _, err := ex.commitPhase(ctx, tx, phaseRecord{seq: seq, name: name, kind: KindCompensation, output: []byte("null"), attempts: 1}); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return ex.breakOff(fmt.Errorf("engine: %s: commit: %w", name, err))
	}
	return nil
}

// takeSeq reserves the next journal position for a phase the engine
// writes (a compensation), past every phase journaled or committed.
func (ex *execution) takeSeq() int {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	seq := max(ex.next, ex.seqEnd)
	ex.next, ex.seqEnd = seq+1, seq+1
	return seq
}

// compensationRecord is the output of a compensated run: what was undone.
func (ex *execution) compensationRecord() []byte {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	rec := Compensation{Compensated: []string{}}
	for i := len(ex.undos) - 1; i >= 0; i-- {
		rec.Compensated = append(rec.Compensated, ex.undos[i].phase)
	}
	raw, _ := json.Marshal(rec)
	return raw
}

// parkForOperator parks the run, as status, until an operator resumes it
// (Reopen): nothing wakes it before.
func (c *Client) parkForOperator(ctx context.Context, ex *execution, status Status, wait *Wait) error {
	tx, err := c.pool.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("engine: park %s: begin: %w", wait.Phase, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	c.logger.WarnContext(ctx, "run parked for an operator", slog.String("run_id", ex.run.ID), slog.String("phase", wait.Phase),
		slog.String("kind", string(wait.Kind)), slog.String("reason", wait.Reason))
	return parkIn(ctx, ex, tx, status, wait)
}

// crashAfter is the test kit's crash (see phase) after an engine-written
// phase committed.
func (ex *execution) crashAfter(ctx context.Context, name string) error {
	if !crashpoint.Hit(ctx, name) {
		return nil
	}
	ex.lose(crashpoint.ErrCrashed)
	return crashpoint.ErrCrashed
}
