package worker

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/ratchet-run/ratchet/recovery"
)

// KindPrune is the River job kind of retention pruning, Ratchet's only job.
const KindPrune = "ratchet.prune"

// pruneTimeout bounds one pruning job: 100 batches of PruneBatchSize runs.
const pruneTimeout = time.Minute

type pruneArgs struct{}

func (pruneArgs) Kind() string { return KindPrune }

type pruneWorker struct {
	river.WorkerDefaults[pruneArgs]
	w *Worker
}

func (p *pruneWorker) Work(ctx context.Context, _ *river.Job[pruneArgs]) error {
	res, err := recovery.Prune(ctx, p.w.pool, &recovery.PruneOpts{BatchSize: p.w.cfg.PruneBatchSize})
	if res.Deleted > 0 {
		p.w.logger.InfoContext(ctx, "pruned expired runs", "runs", res.Deleted, "batches", res.Batches)
	}
	return err
}

func (p *pruneWorker) Timeout(*river.Job[pruneArgs]) time.Duration { return pruneTimeout }
