package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/worker"
)

// Options configure Compare. Zero fields take the defaults given.
type Options struct {
	// Concurrency is the number of callers starting runs at once.
	// Defaults to 16.
	Concurrency int
	// Phases lists the workflow sizes to measure, in no-op atomic phases.
	// Defaults to 1, 3 and 10.
	Phases []int
	// Runs is the number of runs of one measurement. Defaults to 1000.
	Runs int
	// Rounds is how many measurements each engine gets per size; the two
	// engines alternate, so that drift on a shared machine touches both.
	// Defaults to 5.
	Rounds int
	// Sustained, when positive, adds a long measurement of the 3-phase
	// workflow: the plain engine for half of it, a worker's engine for all
	// of it, the plain engine for the other half (so that drift cancels).
	// Whatever a worker defers (its polls, River's maintenance, pruning)
	// happens inside it.
	Sustained time.Duration
	// StaleAfter is the engine's lease length. Defaults to the engine's.
	StaleAfter time.Duration
	// WarmUp is how long the plain engine runs, unmeasured, first: caches,
	// connections and the tables' first pages are not what the first
	// measurement should pay for. 0 skips it.
	WarmUp time.Duration
}

func (o Options) withDefaults() Options {
	if o.Concurrency == 0 {
		o.Concurrency = 16
	}
	if len(o.Phases) == 0 {
		o.Phases = []int{1, 3, 10}
	}
	if o.Runs == 0 {
		o.Runs = 1000
	}
	if o.Rounds == 0 {
		o.Rounds = 5
	}
	return o
}

// engines are the two configurations compared: an engine client alone, and
// the engine client of a started worker (recoverer polling, River running).
var engines = []string{"plain", "worker"}

// measurement is one Drive of one engine, with what it cost.
type measurement struct {
	Result
	counts   Counts
	walBytes int64
}

// Compare measures, on pool (a migrated database of its own, whose
// connections counter traces), runs per second of no-op workflows started
// and executed inline by a plain engine client and by a worker's engine
// client, with the round trips, commits and WAL each run costs. It writes
// a table to out and progress to progress.
func Compare(ctx context.Context, pool *pgxpool.Pool, counter *Counter, opts Options, out, progress io.Writer) error {
	opts = opts.withDefaults()
	workflows := engine.NewWorkflows()
	sizes := slices.Clone(opts.Phases)
	if opts.Sustained > 0 && !slices.Contains(sizes, 3) {
		sizes = append(sizes, 3)
	}
	for _, n := range sizes {
		if err := registerNoop(workflows, n); err != nil {
			return err
		}
	}
	m := &meter{pool: pool, counter: counter, workflows: workflows, opts: opts, progress: progress}

	if opts.WarmUp > 0 {
		fmt.Fprintf(progress, "warming up for %s\n", opts.WarmUp)
		if _, err := m.measure(ctx, "plain", sizes[0], "warm-up", []time.Duration{opts.WarmUp}); err != nil {
			return err
		}
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(out, "concurrency %d, %d runs a measurement, %d rounds: rates and latencies are medians of rounds, worker/plain the median of each round's ratio;\n"+
		"round trips, commits and WAL per run are over all rounds and include the worker's own background work (polls, River)\n"+
		"(worker/plain: median, then the lowest and highest round)\n",
		opts.Concurrency, opts.Runs, opts.Rounds)
	fmt.Fprintln(tw, "phases\tengine\truns/s\tp50 ms\tp99 ms\tround trips/run\tcommits/run\tWAL bytes/run\tworker/plain\t")
	for _, n := range opts.Phases {
		byEngine := map[string][]measurement{}
		var ratios []float64
		for round := range opts.Rounds {
			// Each round measures both engines back to back, in turn first,
			// and yields one ratio: the machine's drift between rounds
			// does not enter it.
			order := slices.Clone(engines)
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, name := range order {
				fmt.Fprintf(progress, "phases=%d engine=%s round %d/%d\n", n, name, round+1, opts.Rounds)
				ms, err := m.measure(ctx, name, n, fmt.Sprintf("r%d", round), []time.Duration{0})
				if err != nil {
					return err
				}
				byEngine[name] = append(byEngine[name], ms[0])
			}
			ratios = append(ratios, byEngine["worker"][round].Rate()/byEngine["plain"][round].Rate())
		}
		slices.Sort(ratios)
		for _, name := range engines {
			ratio := ""
			if name == "worker" {
				ratio = fmt.Sprintf("%.3f (%.2f–%.2f)", ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
			}
			writeRow(tw, strconv.Itoa(n), name, median(byEngine[name]).Result, total(byEngine[name]), ratio)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if opts.Sustained <= 0 {
		return nil
	}

	half := opts.Sustained / 2
	fmt.Fprintf(progress, "sustained: plain %s, worker %s, plain %s\n", half, opts.Sustained, half)
	before, err := m.measure(ctx, "plain", 3, "s1", []time.Duration{half})
	if err != nil {
		return err
	}
	// The worker's run is cut in minutes, so that its rate over time shows
	// whether deferred work drags it down as it accumulates.
	var minutes []time.Duration
	for left := opts.Sustained; left > 0; left -= time.Minute {
		minutes = append(minutes, min(left, time.Minute))
	}
	worker, err := m.measure(ctx, "worker", 3, "s", minutes)
	if err != nil {
		return err
	}
	after, err := m.measure(ctx, "plain", 3, "s2", []time.Duration{half})
	if err != nil {
		return err
	}
	plainAll := append(before, after...)
	workerSum, plainSum := sum(worker), sum(plainAll)
	fmt.Fprintf(out, "\nsustained, 3 phases: plain %s in two halves around a worker's %s\n", opts.Sustained, opts.Sustained)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "segment\tengine\truns/s\tp50 ms\tp99 ms\tround trips/run\tcommits/run\tWAL bytes/run\tworker/plain\t")
	writeRow(tw, "first half", "plain", before[0].Result, before[0], "")
	for i, w := range worker {
		writeRow(tw, fmt.Sprintf("minute %d", i+1), "worker", w.Result, w, "")
	}
	writeRow(tw, "second half", "plain", after[0].Result, after[0], "")
	writeRow(tw, "all", "plain", plainSum.Result, plainSum, "")
	writeRow(tw, "all", "worker", workerSum.Result, workerSum, fmt.Sprintf("%.3f", workerSum.Rate()/plainSum.Rate()))
	return tw.Flush()
}

func writeRow(w io.Writer, label, engine string, r Result, cost measurement, ratio string) {
	perRun := func(v int64) string { return fmt.Sprintf("%.2f", float64(v)/float64(cost.Ops)) }
	fmt.Fprintf(w, "%s\t%s\t%.0f\t%s\t%s\t%s\t%s\t%.0f\t%s\t\n", label, engine, r.Rate(),
		ms(r.P50), ms(r.P99), perRun(cost.counts.Statements), perRun(cost.counts.Commits),
		float64(cost.walBytes)/float64(cost.Ops), ratio)
}

// ms formats a latency in milliseconds; "-" for none.
func ms(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000)
}

// median returns the element of median rate.
func median[T interface{ Rate() float64 }](ms []T) T {
	s := slices.Clone(ms)
	slices.SortFunc(s, func(a, b T) int { return cmp.Compare(a.Rate(), b.Rate()) })
	return s[len(s)/2]
}

// total sums the costs of measurements, for per-run figures over all of
// them.
func total(ms []measurement) measurement {
	var t measurement
	for _, m := range ms {
		t.Ops += m.Ops
		t.counts.Statements += m.counts.Statements
		t.counts.Commits += m.counts.Commits
		t.counts.Batches += m.counts.Batches
		t.counts.Batched += m.counts.Batched
		t.walBytes += m.walBytes
	}
	return t
}

// sum is total with a rate: operations over the summed time. It has no
// percentiles (they are shown per segment).
func sum(ms []measurement) measurement {
	t := total(ms)
	for _, m := range ms {
		t.Elapsed += m.Elapsed
	}
	return t
}

// meter runs measurements.
type meter struct {
	pool      *pgxpool.Pool
	counter   *Counter
	workflows *engine.Workflows
	opts      Options
	progress  io.Writer
}

// measure starts an engine of the given kind and drives the n-phase
// workflow with it: for opts.Runs runs when a duration is 0, else for that
// long, once per duration, back to back; it returns one measurement per
// duration. A worker is started before and stopped after all of them.
func (m *meter) measure(ctx context.Context, kind string, n int, tag string, durations []time.Duration) ([]measurement, error) {
	cfg := engine.Config{Workflows: m.workflows, StaleAfter: m.opts.StaleAfter}
	var (
		c    *engine.Client
		stop = func() error { return nil }
	)
	switch kind {
	case "plain":
		var err error
		if c, err = engine.NewClient(m.pool, &cfg); err != nil {
			return nil, err
		}
	case "worker":
		w, err := worker.New(m.pool, &worker.Config{Engine: cfg})
		if err != nil {
			return nil, err
		}
		if err := w.Start(ctx); err != nil {
			return nil, err
		}
		c = w.Engine()
		stop = func() error {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			return w.Stop(ctx)
		}
	}
	workflow := noopName(n)
	var out []measurement
	for seg, d := range durations {
		// The WAL position is read outside the counted window.
		wal := m.wal(ctx)
		counts := m.counter.Read()
		runs := 0
		if d == 0 {
			runs = m.opts.Runs
		}
		res, err := Drive(ctx, m.opts.Concurrency, runs, d, func(ctx context.Context, i int) error {
			key := fmt.Sprintf("%s-%s-%d-%d-%d", kind, tag, n, seg, i)
			res, err := c.Start(ctx, engine.StartParams{Workflow: workflow, IdempotencyKey: key, Input: []byte(`{}`)})
			if err == nil && res.Run.Status != engine.StatusSucceeded {
				err = fmt.Errorf("run %s ended %s", key, res.Run.Status)
			}
			return err
		})
		if err != nil {
			_ = stop()
			return nil, err
		}
		counted := m.counter.Read().Sub(counts)
		out = append(out, measurement{Result: res, counts: counted, walBytes: m.wal(ctx) - wal})
		fmt.Fprintf(m.progress, "  %d runs in %s: %.0f runs/s\n", res.Ops, res.Elapsed.Round(time.Millisecond), res.Rate())
	}
	return out, stop()
}

// wal reads the server's WAL position in bytes (0 if it cannot: WAL
// figures are then meaningless, the rest is not).
func (m *meter) wal(ctx context.Context) int64 {
	var lsn int64
	_ = m.pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`).Scan(&lsn)
	return lsn
}

func noopName(n int) string { return "noop" + strconv.Itoa(n) }

// registerNoop registers a workflow of n atomic phases that do nothing but
// commit.
func registerNoop(workflows *engine.Workflows, n int) error {
	names := make([]string, n)
	for i := range names {
		names[i] = "phase-" + strconv.Itoa(i+1)
	}
	noop := func(context.Context, pgx.Tx) (struct{}, error) { return struct{}{}, nil }
	_, err := engine.Register(workflows, noopName(n), func(ctx context.Context, _ struct{}) (struct{}, error) {
		for _, name := range names {
			if _, err := engine.Atomic(ctx, name, noop, nil); err != nil {
				return struct{}{}, err
			}
		}
		return struct{}{}, nil
	}, nil)
	return err
}
