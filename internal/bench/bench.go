// Package bench measures what Ratchet costs: it drives workflows from many
// goroutines and counts, on the pool's connections, the statements (round
// trips) and committed transactions they cause. `ratchet bench` and the
// engine's Go benchmarks use it. It is a measuring tool, never imported by
// the library.
package bench

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Counter is a pgx.QueryTracer and pgx.BatchTracer that counts the round
// trips on a pool's connections (a statement alone, or a batch of them),
// and the transactions committed: every COMMIT, every statement sent
// outside a transaction but BEGIN (it commits by itself), read-only ones
// included, and every batch sent outside a transaction (one implicit
// transaction).
type Counter struct {
	statements, commits, batches, batched atomic.Int64
}

// TraceBatchStart counts the batch: one round trip, one commit.
func (c *Counter) TraceBatchStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.statements.Add(1)
	c.batches.Add(1)
	if conn.PgConn().TxStatus() == 'I' {
		c.commits.Add(1)
	}
	return ctx
}

// TraceBatchQuery counts a statement of a batch.
func (c *Counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.batched.Add(1)
}

// TraceBatchEnd does nothing.
func (c *Counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TraceQueryStart counts the statement.
func (c *Counter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	sql := strings.TrimSpace(data.SQL)
	switch {
	case hasPrefixFold(sql, "commit"):
		c.commits.Add(1)
	case conn.PgConn().TxStatus() == 'I' && !hasPrefixFold(sql, "begin"):
		c.commits.Add(1)
	}
	return ctx
}

// TraceQueryEnd does nothing.
func (c *Counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Counts are a Counter's totals at one moment: round trips (Statements:
// a batch counts once), commits, the batches and the statements sent in
// them.
type Counts struct{ Statements, Commits, Batches, Batched int64 }

// Sub returns the counts since an earlier reading.
func (c Counts) Sub(earlier Counts) Counts {
	return Counts{Statements: c.Statements - earlier.Statements, Commits: c.Commits - earlier.Commits,
		Batches: c.Batches - earlier.Batches, Batched: c.Batched - earlier.Batched}
}

// Read returns the totals so far.
func (c *Counter) Read() Counts {
	return Counts{Statements: c.statements.Load(), Commits: c.commits.Load(), Batches: c.batches.Load(), Batched: c.batched.Load()}
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// Result is what Drive measured.
type Result struct {
	Ops      int
	Elapsed  time.Duration
	P50, P99 time.Duration
}

// Rate is operations per second.
func (r Result) Rate() float64 { return float64(r.Ops) / r.Elapsed.Seconds() }

// Drive calls op from concurrency goroutines, i counting up from 0, until
// n calls are done (n > 0) or, with n == 0, until d has passed. The first
// error stops it and is returned.
func Drive(ctx context.Context, concurrency, n int, d time.Duration, op func(ctx context.Context, i int) error) (Result, error) {
	if concurrency < 1 || n < 0 || (n == 0 && d <= 0) {
		return Result{}, errors.New("bench: Drive needs a concurrency and a count or a duration")
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		next      atomic.Int64
		mu        sync.Mutex
		latencies []time.Duration
		wg        sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			defer func() {
				mu.Lock()
				latencies = append(latencies, mine...)
				mu.Unlock()
			}()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if (n > 0 && i >= n) || (n == 0 && time.Now().After(deadline)) {
					return
				}
				t0 := time.Now()
				if err := op(ctx, i); err != nil {
					cancel(err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := context.Cause(ctx); err != nil {
		return Result{}, err
	}
	if len(latencies) == 0 {
		return Result{}, errors.New("bench: no operation completed")
	}
	slices.Sort(latencies)
	return Result{
		Ops: len(latencies), Elapsed: elapsed,
		P50: latencies[len(latencies)/2], P99: latencies[len(latencies)*99/100],
	}, nil
}
