package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Coalesced commits.
//
// A step's result and a run's finish are each one fenced statement sent
// outside any transaction of the caller's: alone, each pays a round trip,
// a commit and a WAL flush. The coalescer sends those of concurrent
// executions that are ready within Config.CommitWindow to Postgres
// together, as one pipeline ending in one Sync: one round trip, one implicit
// transaction, one commit. Each statement keeps its own fence, so that a
// run whose lease was lost matches nothing and leaves the others to commit.
//
// A statement the server refuses aborts the implicit transaction, and with
// it every statement of the batch: then each is sent again alone, so that
// its error is its run's alone and the others commit. When the outcome of a
// batch is unknown (the connection broke, the commit timed out), each
// statement reports that error, as a statement sent alone would.
//
// An atomic phase keeps its own transaction (the caller's statements are in
// it); so do claims, which must read the run before executing it.
type coalescer struct {
	pool   *pgxpool.Pool
	window time.Duration // <= 0: every statement is sent alone
	max    int
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
	err  error
	done chan struct{}
}

// query runs sql, a fenced statement that commits by itself, and hands its
// rows to read (which must close them), coalescing it with other
// executions' statements within the window. Once queued, a statement is
// waited for even if ctx ends: its outcome must be known.
func (co *coalescer) query(ctx context.Context, sql string, args []any, read func(pgx.Rows) error) error {
	if co.window <= 0 {
		return co.alone(ctx, sql, args, read)
	}
	req := &commitRequest{sql: sql, args: args, read: read, done: make(chan struct{})}
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
func (co *coalescer) alone(ctx context.Context, sql string, args []any, read func(pgx.Rows) error) error {
	rows, err := co.pool.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	return read(rows)
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
	batch := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(reqs))}
	for _, r := range reqs {
		batch.Queue(r.sql, r.args...)
	}
	br := co.pool.SendBatch(ctx, batch)
	refused := false
	for _, r := range reqs {
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

// queryRun runs a fenced statement returning runColumns through the
// coalescer and yields the run, or ok=false when it returned no row.
func (co *coalescer) queryRun(ctx context.Context, sql string, args ...any) (run *Run, ok bool, err error) {
	err = co.query(ctx, sql, args, func(rows pgx.Rows) error {
		run, ok = nil, false // a batch sent again reads again
		r, err := pgx.CollectExactlyOneRow(rows, pgx.RowToAddrOfStructByName[Run])
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err != nil:
			return err
		}
		run, ok = r, true
		return nil
	})
	if err != nil {
		return nil, false, notMigrated(err)
	}
	return run, ok, nil
}

// scanOne returns a read that scans a statement's one row into dest.
func scanOne(dest ...any) func(pgx.Rows) error {
	return func(rows pgx.Rows) error {
		defer rows.Close()
		if !rows.Next() {
			if err := rows.Err(); err != nil {
				return err
			}
			return pgx.ErrNoRows
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
}
