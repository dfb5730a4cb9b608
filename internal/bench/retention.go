package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/recovery"
)

// RetentionOptions configure Retention. Zero fields take the defaults
// given.
type RetentionOptions struct {
	// History is the number of finished runs seeded. Defaults to 1,000,000.
	History int
	// Expired is how many of them (the oldest) are past their retention:
	// enough that no segment's pruner runs out (the table says when one
	// did). Defaults to 900,000.
	Expired int
	// PerDay is the pruning load to show, in expired runs a day: the paced
	// pruner deletes a batch as often as this needs. Defaults to 5,000,000.
	PerDay int
	// BatchSize is the pruner's runs per statement. Defaults to 500 (the
	// worker's default).
	BatchSize int
	// Segment is the length of one measurement of the hot path. Defaults
	// to 20s.
	Segment time.Duration
	// Rounds is how many segments each pruning mode gets, in turn.
	// Defaults to 3.
	Rounds int
	// Concurrency is the number of callers starting runs. Defaults to 16.
	Concurrency int
}

func (o RetentionOptions) withDefaults() RetentionOptions {
	o.History = cmp.Or(o.History, 1_000_000)
	o.Expired = cmp.Or(o.Expired, 900_000)
	o.PerDay = cmp.Or(o.PerDay, 5_000_000)
	o.BatchSize = cmp.Or(o.BatchSize, 500)
	o.Segment = cmp.Or(o.Segment, 20*time.Second)
	o.Rounds = cmp.Or(o.Rounds, 3)
	o.Concurrency = cmp.Or(o.Concurrency, 16)
	return o
}

// pruneModes are the pruning loads Retention measures the hot path under.
var pruneModes = []string{"none", "paced", "flat-out"}

// Retention measures pruning at volume on pool (a migrated database of its
// own): it seeds opts.History finished runs by SQL, the oldest
// opts.Expired of them past their retention, then drives the hot path (a
// workflow of three steps, started and executed inline) in segments with
// no pruning, with a pruner paced to delete opts.PerDay runs a day, and
// with a pruner deleting as fast as it can, in turn. It reports the hot
// path's rate and latency under each, and the prune rate.
func Retention(ctx context.Context, pool *pgxpool.Pool, opts RetentionOptions, out, progress io.Writer) error {
	opts = opts.withDefaults()
	if opts.Expired > opts.History {
		return fmt.Errorf("bench: %d expired runs of a history of %d", opts.Expired, opts.History)
	}
	began := time.Now()
	if err := SeedHistory(ctx, pool, 1, opts.History, opts.History+10_000, func(done int) {
		fmt.Fprintf(progress, "seeded %d of %d runs (%s)\n", done, opts.History, time.Since(began).Round(time.Second))
	}); err != nil {
		return err
	}
	// The oldest runs expired over the last day, oldest first.
	if _, err := pool.Exec(ctx, `
		UPDATE ratchet.runs SET expires_at = now() - interval '1 day' + (id::bigint * interval '1 day' / $1::bigint)
		WHERE finished_at IS NOT NULL AND id <= lpad($1::bigint::text, 26, '0')`, opts.Expired); err != nil {
		return fmt.Errorf("bench: expire the oldest runs: %w", err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE ratchet.runs`); err != nil {
		return err
	}
	fmt.Fprintf(progress, "history ready in %s\n", time.Since(began).Round(time.Second))

	workflows := engine.NewWorkflows()
	if err := registerSteps(workflows); err != nil {
		return err
	}
	c, err := engine.NewClient(pool, &engine.Config{Workflows: workflows})
	if err != nil {
		return err
	}
	fmt.Fprintf(progress, "warming up for %s\n", opts.Segment/2)
	if _, err := Drive(ctx, opts.Concurrency, 0, opts.Segment/2, func(ctx context.Context, i int) error {
		_, err := c.Start(ctx, engine.StartParams{Workflow: stepsWorkflow, IdempotencyKey: fmt.Sprint("warm-up-", i), Input: []byte(`{}`)})
		return err
	}); err != nil {
		return err
	}
	// The paced pruner deletes one batch every interval: opts.PerDay a day.
	interval := time.Duration(float64(24*time.Hour) * float64(opts.BatchSize) / float64(opts.PerDay))

	type segment struct {
		Result
		pruned     int64
		pruneTime  time.Duration
		statements int
		ranOut     bool // a batch came back short: the pruner had nothing left to delete
	}
	byMode := map[string][]segment{}
	for round := range opts.Rounds {
		order := slices.Clone(pruneModes)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, mode := range order {
			fmt.Fprintf(progress, "%s pruning, round %d/%d\n", mode, round+1, opts.Rounds)
			segCtx, stop := context.WithCancel(ctx)
			var (
				seg      segment
				wg       sync.WaitGroup
				pruneMu  sync.Mutex
				pruneErr error
			)
			if mode != "none" {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for segCtx.Err() == nil {
						t0 := time.Now()
						res, err := recovery.Prune(segCtx, pool, &recovery.PruneOpts{BatchSize: opts.BatchSize, MaxBatches: 1})
						if err != nil {
							if segCtx.Err() == nil {
								pruneMu.Lock()
								pruneErr = err
								pruneMu.Unlock()
							}
							return
						}
						seg.pruned += res.Deleted
						seg.ranOut = seg.ranOut || res.Deleted < int64(opts.BatchSize)
						seg.pruneTime += time.Since(t0)
						seg.statements++
						if mode == "paced" {
							select {
							case <-segCtx.Done():
							case <-time.After(interval - time.Since(t0)):
							}
						}
					}
				}()
			}
			res, err := Drive(ctx, opts.Concurrency, 0, opts.Segment, func(ctx context.Context, i int) error {
				key := fmt.Sprintf("%s-%d-%d", mode, round, i)
				r, err := c.Start(ctx, engine.StartParams{Workflow: stepsWorkflow, IdempotencyKey: key, Input: []byte(`{}`)})
				if err == nil && r.Run.Status != engine.StatusSucceeded {
					err = fmt.Errorf("run %s ended %s", key, r.Run.Status)
				}
				return err
			})
			stop()
			wg.Wait()
			if err != nil {
				return err
			}
			if pruneErr != nil {
				return pruneErr
			}
			seg.Result = res
			byMode[mode] = append(byMode[mode], seg)
			fmt.Fprintf(progress, "  %.0f runs/s, %d runs pruned\n", res.Rate(), seg.pruned)
		}
	}
	var left int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs WHERE expires_at <= now()`).Scan(&left); err != nil {
		return err
	}

	fmt.Fprintf(out, "history %d finished runs (3 phases each), %d of them expired; %d callers; %d segments of %s per mode, in turn;\n"+
		"rates and latencies are medians of segments; \"paced\" deletes a batch of %d every %s (%d runs a day), \"flat-out\" back to back.\n",
		opts.History, opts.Expired, opts.Concurrency, opts.Rounds, opts.Segment, opts.BatchSize, interval.Round(10*time.Millisecond), opts.PerDay)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pruning\truns/s\tp50 ms\tp99 ms\t÷ none\truns pruned\tpruned/s while pruning\tms per batch\tdeleted at this rate, a day\t")
	base := median(byMode["none"])
	for _, mode := range pruneModes {
		segs := byMode[mode]
		med := median(segs)
		var pruned int64
		var pruneTime time.Duration
		var statements int
		var elapsed time.Duration
		for _, s := range segs {
			pruned += s.pruned
			pruneTime += s.pruneTime
			statements += s.statements
			elapsed += s.Elapsed
		}
		rate, perBatch, perDay := "-", "-", "-"
		if pruned > 0 {
			rate = fmt.Sprintf("%.0f", float64(pruned)/pruneTime.Seconds())
			perBatch = fmt.Sprintf("%.0f", float64(pruneTime.Milliseconds())/float64(statements))
			perDay = fmt.Sprintf("%.1f M", float64(pruned)/elapsed.Seconds()*86400/1e6)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%.3f\t%d\t%s\t%s\t%s\t\n", mode, med.Rate(), ms(med.P50), ms(med.P99),
			med.Rate()/base.Rate(), pruned, rate, perBatch, perDay)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "expired runs left unpruned: %d\n", left)
	for _, mode := range pruneModes {
		for i, s := range byMode[mode] {
			if s.ranOut {
				fmt.Fprintf(out, "note: the %s pruner of round %d ran out of expired runs; its segment's figures include time with nothing to prune (raise --expired)\n", mode, i+1)
			}
		}
	}
	return nil
}
