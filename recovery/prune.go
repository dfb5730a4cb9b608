package recovery

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pruneSQL deletes one batch of finished runs past their expiry (their
// phases go with them). Unfinished runs and runs kept forever have no
// expires_at and are never chosen. SKIP LOCKED lets two pruners share the
// work without waiting on each other.
const pruneSQL = `
DELETE FROM ratchet.runs WHERE id IN (
	SELECT id FROM ratchet.runs
	WHERE expires_at <= now() AND finished_at IS NOT NULL
	ORDER BY expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED)`

// pruneSignalsSQL deletes one batch of signals no run consumed before
// their retention ended. Consumed ones go with the run that consumed them.
const pruneSignalsSQL = `
DELETE FROM ratchet.signals WHERE id IN (
	SELECT id FROM ratchet.signals
	WHERE expires_at <= now() AND consumed_at IS NULL
	ORDER BY expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED)`

// PruneOpts bound a Prune call. A nil *PruneOpts is valid.
type PruneOpts struct {
	// BatchSize is the number of runs deleted per statement. Defaults to 500.
	BatchSize int
	// MaxBatches bounds the batches of one call. Defaults to 100.
	MaxBatches int
}

// PruneResult reports what Prune deleted.
type PruneResult struct {
	Deleted int64 // runs
	Batches int
	// Signals counts the unconsumed signals deleted past their retention.
	Signals int64
}

// Prune deletes finished runs past expires_at (with their journals and
// signals), then unconsumed signals past theirs, in batches, each its own
// transaction, until a batch comes back short or MaxBatches is reached. A
// key whose run was pruned is free: the next start with it is a new run.
func Prune(ctx context.Context, pool *pgxpool.Pool, opts *PruneOpts) (PruneResult, error) {
	batch, maxBatches := 500, 100
	if opts != nil && opts.BatchSize > 0 {
		batch = opts.BatchSize
	}
	if opts != nil && opts.MaxBatches > 0 {
		maxBatches = opts.MaxBatches
	}
	var res PruneResult
	for res.Batches < maxBatches {
		tag, err := pool.Exec(ctx, pruneSQL, batch)
		if err != nil {
			return res, fmt.Errorf("recovery: prune: %w", err)
		}
		res.Batches++
		res.Deleted += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			break
		}
	}
	for batches := 0; batches < maxBatches; batches++ {
		tag, err := pool.Exec(ctx, pruneSignalsSQL, batch)
		if err != nil {
			return res, fmt.Errorf("recovery: prune signals: %w", err)
		}
		res.Signals += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			break
		}
	}
	return res, nil
}
