package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Coalesced commits.
//
// Start's claim, a step's result and a run's finish are each one
// statement sent outside any transaction of the caller's: alone, each pays
// a round trip, a commit and a WAL flush. The coalescer sends those of
// concurrent executions that are ready within Config.CommitWindow to
// Postgres together, as one pipeline ending in one Sync: one round trip,
// one implicit transaction, one commit. Each statement keeps its own
// fence, so that a run whose lease was lost matches nothing and leaves the
// others to commit.
//
// A statement the server refuses aborts the implicit transaction, and with
// it every statement of the batch: then each is sent again alone, so that
// its error is its run's alone and the others commit. When the outcome of a
// batch is unknown (the connection broke, the commit timed out), each
// statement reports that error, as a statement sent alone would.
//
// An atomic phase keeps its own transaction (the caller's statements are in
// it), and StartTx's claim is in the caller's.
type coalescer struct {
	pool   *pgxpool.Pool
	window time.Duration // <= 0: every statement is sent alone
	// executing counts the client's executions in progress: when every one
	// of them has a statement waiting, no other can join the batch, which is
	// sent without waiting out the window.
	executing *atomic.Int64

	mu      sync.Mutex
	forming *commitBatch // the batch statements join, nil when none is forming

	// batches counts the batches sent, statements the statements in them,
	// refused the batches the server refused (their statements sent again
	// alone): for tests.
	batches, statements, refused atomic.Int64
	// readOnly counts the statements sent again after a standby refused
	// them.
	readOnly atomic.Int64
}

// maxBatch bounds the statements of a batch: a full batch is sent at once.
const maxBatch = 128

// commitBatch is a batch being formed, then sent by its leader (the
// caller of the first statement).
type commitBatch struct {
	reqs []*commitRequest
	full chan struct{} // closed when the batch should be sent without waiting further
}

// commitRequest is one statement of a batch: read consumes its rows (and
// closes them); err is its outcome, set before done is closed.
type commitRequest struct {
	sql  string
	args []any
	read func(pgx.Rows) error
	// phase, for a step's result, lets the batch send it with the results
	// of other runs as one statement (commitPhasesSQL), its row read into
	// outcome.
	phase   *phaseCommit
	outcome *phaseOutcome
	err     error
	done    chan struct{}
}

// query runs sql, a fenced statement that commits by itself, and hands its
// rows to read (which must close them), coalescing it with other
// executions' statements within the window. Once queued, a statement is
// waited for even if ctx ends: its outcome must be known.
func (co *coalescer) query(ctx context.Context, sql string, args []any, read func(pgx.Rows) error) error {
	return co.submit(ctx, &commitRequest{sql: sql, args: args, read: read})
}

// commitPhase runs commitPhaseSQL for pc, by itself or coalesced, and
// reads its row into out.
func (co *coalescer) commitPhase(ctx context.Context, pc *phaseCommit, out *phaseOutcome) error {
	return co.submit(ctx, &commitRequest{sql: commitPhaseSQL, args: pc.args(), read: out.read, phase: pc, outcome: out})
}

// submit queues req (or, with coalescing off, runs it alone) and returns
// its outcome.
func (co *coalescer) submit(ctx context.Context, req *commitRequest) error {
	if co.window <= 0 {
		return co.alone(ctx, req.sql, req.args, req.read)
	}
	req.done = make(chan struct{})
	co.mu.Lock()
	b := co.forming
	leader := b == nil
	if leader {
		b = &commitBatch{full: make(chan struct{})}
		co.forming = b
	}
	b.reqs = append(b.reqs, req)
	if n := len(b.reqs); n >= maxBatch || int64(n) >= co.executing.Load() {
		co.forming = nil
		close(b.full)
	}
	co.mu.Unlock()
	if !leader {
		<-req.done
		return req.err
	}
	timer := time.NewTimer(co.window)
	select {
	case <-b.full:
	case <-timer.C:
		co.mu.Lock()
		if co.forming == b {
			co.forming = nil
		}
		co.mu.Unlock()
	}
	timer.Stop()
	// b.reqs no longer grows: the batch is detached from forming.
	co.send(ctx, b.reqs)
	return req.err
}

// alone runs one statement by itself.
//
// A statement a standby refused (25006 read_only_sql_transaction) wrote
// nothing, so it is sent once more: a pool that drops a connection on that
// error (as the service's does) gives a fresh one, which a multi-host URL
// with target_session_attrs=read-write takes to the primary.
func (co *coalescer) alone(ctx context.Context, sql string, args []any, read func(pgx.Rows) error) error {
	once := func() error {
		rows, err := co.pool.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		return read(rows)
	}
	err := once()
	if isReadOnly(err) {
		co.readOnly.Add(1)
		err = once()
	}
	return err
}

// isReadOnly reports whether a standby refused the statement.
func isReadOnly(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.ReadOnlySQLTransaction
}

// send runs reqs as one pipeline and settles each.
func (co *coalescer) send(ctx context.Context, reqs []*commitRequest) {
	defer func() {
		for _, r := range reqs {
			close(r.done)
		}
	}()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stepCommitTimeout)
	defer cancel()
	if len(reqs) == 1 {
		r := reqs[0]
		r.err = co.alone(ctx, r.sql, r.args, r.read)
		return
	}
	co.batches.Add(1)
	co.statements.Add(int64(len(reqs)))
	// The step results of distinct runs go as one statement; the rest (a
	// finish, a second result of a run already in it) one by one after it.
	phases, rest := splitPhases(reqs)
	batch := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(rest)+1)}
	if len(phases) > 0 {
		batch.Queue(commitPhasesSQL, phaseArrays(phases)...)
	}
	for _, r := range rest {
		batch.Queue(r.sql, r.args...)
	}
	br := co.pool.SendBatch(ctx, batch)
	refused := false
	if len(phases) > 0 {
		rows, err := br.Query()
		if err == nil {
			err = readPhases(rows, phases)
		}
		for _, r := range phases {
			r.err = err
		}
		refused = refused || isServerError(err)
	}
	for _, r := range rest {
		rows, err := br.Query()
		if err == nil {
			err = r.read(rows)
		}
		r.err = err
		refused = refused || isServerError(err)
	}
	closeErr := br.Close()
	refused = refused || isServerError(closeErr)
	switch {
	case refused:
		// The server refused a statement (or the commit): the implicit
		// transaction rolled back whole. Each statement again, alone.
		co.refused.Add(1)
		for _, r := range reqs {
			r.err = co.alone(ctx, r.sql, r.args, r.read)
		}
	case closeErr != nil:
		// The outcome is unknown: every statement says so.
		for _, r := range reqs {
			if r.err == nil {
				r.err = closeErr
			}
		}
	}
}

// isServerError reports whether err is an error the server reported for a
// statement, which aborts the transaction it is in (as opposed to a broken
// connection, whose transaction's outcome is unknown).
func isServerError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}

// queryRun runs a statement returning runColumns through the coalescer
// and yields the run, or ok=false when it returned no row.
func (co *coalescer) queryRun(ctx context.Context, sql string, args ...any) (run *Run, ok bool, err error) {
	err = co.query(ctx, sql, args, func(rows pgx.Rows) (err error) {
		run, ok, err = collectRun(rows) // a batch sent again reads again
		return err
	})
	if err != nil {
		return nil, false, notMigrated(err)
	}
	return run, ok, nil
}

// phaseOutcome is commitPhaseSQL's row: whether the phase was journaled,
// whether a cancellation is pending, and whether a refused commit was
// refused for one.
type phaseOutcome struct {
	Committed, Cancel, RefusedForCancel bool
}

// read reads a statement's one row into o.
func (o *phaseOutcome) read(rows pgx.Rows) (err error) {
	*o, err = pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[phaseOutcome])
	return err
}

// phaseCommit is a journal row with the run and lease it is fenced by:
// commitPhaseSQL's parameters.
type phaseCommit struct {
	phaseRecord
	runID   string
	token   int64
	errJSON []byte // phaseRecord.err encoded; nil: no error
}

// step reports whether the phase's result is kept even when a cancellation
// is pending (anything but an atomic phase: its call has happened).
func (pc *phaseCommit) step() bool { return pc.kind != KindAtomic }

func (pc *phaseCommit) args() []any {
	return []any{pc.runID, pc.token, pc.name, pc.seq, string(pc.kind), pc.output, pc.childKey, pc.attempts, pc.errJSON, pc.startedAt,
		pc.step(), pc.compensable, pc.pivot}
}

// commitPhasesSQL is commitPhaseSQL for many runs at once: one row of
// arrays per run, each fenced by its own token, one result row per input
// row in their order. The runs must be distinct (an UPDATE … FROM changes a
// row once). One statement rather than one per run: Postgres starts its
// executor, takes its snapshot and plans (or binds) once for the batch.
const commitPhasesSQL = `
WITH input AS (
	SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::int[], $5::text[], $6::jsonb[], $7::text[], $8::int[],
		$9::jsonb[], $10::timestamptz[], $11::bool[], $12::bool[], $13::bool[])
		WITH ORDINALITY AS i(id, token, name, seq, kind, output, child_key, attempts, error, started_at, step, compensable, pivot, ord)
), advanced AS (
	UPDATE ratchet.runs r SET recovery_point = i.name, waiting_for = NULL, updated_at = now(),
		pivot = CASE WHEN i.pivot THEN i.name ELSE r.pivot END
	FROM input i
	WHERE r.id = i.id AND r.lease_token = i.token AND r.finished_at IS NULL
		AND (r.cancel_requested_at IS NULL OR i.step)
	RETURNING i.ord, r.attempt, r.cancel_requested_at IS NOT NULL AS cancel
), journaled AS (
	INSERT INTO ratchet.phases (run_id, seq, name, kind, output, child_key, attempts, error, started_at, finished_at, compensable, execution)
	SELECT i.id, i.seq, i.name, i.kind, i.output, i.child_key, i.attempts, i.error, coalesce(i.started_at, now()), clock_timestamp(),
		i.compensable, a.attempt
	FROM advanced a JOIN input i USING (ord)
	RETURNING run_id
)
SELECT i.ord, j.run_id IS NOT NULL, coalesce(a.cancel, false),
	CASE WHEN j.run_id IS NOT NULL THEN false ELSE coalesce((
		SELECT r.lease_token = i.token AND r.finished_at IS NULL AND r.cancel_requested_at IS NOT NULL
		FROM ratchet.runs r WHERE r.id = i.id), false) END
FROM input i LEFT JOIN advanced a USING (ord) LEFT JOIN journaled j ON j.run_id = i.id
ORDER BY i.ord`

// splitPhases separates the step results of distinct runs (when there are
// two or more) from the rest of reqs, each in order.
func splitPhases(reqs []*commitRequest) (phases, rest []*commitRequest) {
	seen := map[string]bool{}
	for _, r := range reqs {
		if r.phase != nil && !seen[r.phase.runID] {
			seen[r.phase.runID] = true
			phases = append(phases, r)
		} else {
			rest = append(rest, r)
		}
	}
	if len(phases) < 2 {
		return nil, reqs
	}
	return phases, rest
}

// phaseArrays turns step results into commitPhasesSQL's arrays.
func phaseArrays(reqs []*commitRequest) []any {
	n := len(reqs)
	var (
		ids, names, kinds         = make([]string, n), make([]string, n), make([]string, n)
		tokens                    = make([]int64, n)
		seqs, attempts            = make([]int, n), make([]int, n)
		outputs, errs             = make([][]byte, n), make([][]byte, n)
		childKeys                 = make([]*string, n)
		startedAt                 = make([]*time.Time, n)
		steps, compensable, pivot = make([]bool, n), make([]bool, n), make([]bool, n)
	)
	for i, r := range reqs {
		pc := r.phase
		ids[i], tokens[i], names[i], seqs[i], kinds[i] = pc.runID, pc.token, pc.name, pc.seq, string(pc.kind)
		outputs[i], childKeys[i], attempts[i], errs[i], startedAt[i] = pc.output, pc.childKey, pc.attempts, pc.errJSON, pc.startedAt
		steps[i], compensable[i], pivot[i] = pc.step(), pc.compensable, pc.pivot
	}
	return []any{ids, tokens, names, seqs, kinds, outputs, childKeys, attempts, errs, startedAt, steps, compensable, pivot}
}

// readPhases reads commitPhasesSQL's rows into each request's outcome.
func readPhases(rows pgx.Rows, reqs []*commitRequest) error {
	type row struct {
		Ord int
		phaseOutcome
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return err
	}
	if len(got) != len(reqs) {
		return errors.New("engine: coalesced commit: not one row per step result")
	}
	for i, r := range got {
		if r.Ord != i+1 {
			return errors.New("engine: coalesced commit: rows out of order")
		}
		*reqs[i].outcome = r.phaseOutcome
	}
	return nil
}
