package bench_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/internal/bench"
	"github.com/ratchet-run/ratchet/internal/testdb"
)

func TestCounterCountsRoundTripsAndCommittedTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.NewURL(t))
	require.NoError(t, err)
	counter := &bench.Counter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()

	step := func(do func() error) bench.Counts {
		before := counter.Read()
		require.NoError(t, do())
		return counter.Read().Sub(before)
	}
	require.Equal(t, bench.Counts{Statements: 1, Commits: 1}, step(func() error {
		_, err := pool.Exec(ctx, `SELECT 1`)
		return err
	}), "a statement outside a transaction commits by itself")
	require.Equal(t, bench.Counts{Statements: 4, Commits: 1}, step(func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT 2`)
			return err
		})
	}), "BEGIN, two statements, COMMIT")
	require.Equal(t, bench.Counts{Statements: 3, Commits: 0}, step(func() error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
			return err
		}
		return tx.Rollback(ctx)
	}), "a rolled-back transaction commits nothing")
	require.Equal(t, bench.Counts{Statements: 1, Commits: 1, Batches: 1, Batched: 3}, step(func() error {
		b := &pgx.Batch{}
		for i := range 3 {
			b.Queue(`SELECT $1::int`, i)
		}
		return pool.SendBatch(ctx, b).Close()
	}), "a batch outside a transaction is one round trip and one implicit transaction")
}

func TestDriveRunsExactlyNOpsOrForADurationAndStopsAtAnError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	res, err := bench.Drive(ctx, 4, 100, 0, func(context.Context, int) error { return nil })
	require.NoError(t, err)
	require.Equal(t, 100, res.Ops)

	res, err = bench.Drive(ctx, 2, 0, 50*time.Millisecond, func(context.Context, int) error { return nil })
	require.NoError(t, err)
	require.GreaterOrEqual(t, res.Elapsed, 50*time.Millisecond)
	require.Positive(t, res.Ops)

	boom := errors.New("boom")
	_, err = bench.Drive(ctx, 4, 1000, 0, func(_ context.Context, i int) error {
		if i == 10 {
			return boom
		}
		return nil
	})
	require.ErrorIs(t, err, boom)
}
