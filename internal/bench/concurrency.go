package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
	"github.com/ratchet-run/ratchet/worker"
)

// ConcurrencyOptions configure Concurrency. Zero fields take the defaults
// given.
type ConcurrencyOptions struct {
	// Runs is how many limited runs are started. Defaults to 10,000.
	Runs int
	// Keys is how many concurrency keys they are spread over, round
	// robin. Defaults to 100.
	Keys int
	// Limit is each key's limit. Defaults to 1.
	Limit int
	// Callers is the number of callers starting runs at once. Defaults
	// to 16.
	Callers int
	// Work is how long a run holds its slot between its two steps, so
	// that runs of a key would overlap without the limit. Defaults to
	// 2 ms.
	Work time.Duration
	// QueueRuns is how many runs go through a queue with a rate limit of
	// QueueRate starts a second. Default to 3000 and 200; QueueRuns -1
	// skips it.
	QueueRuns, QueueRate int
	// HotRuns is the number of runs of one measurement of the hot path
	// with no limit declared, and HotRounds how many each configuration
	// gets, in turn. Default to 2000 and 5; HotRounds -1 skips it.
	HotRuns, HotRounds int
}

func (o ConcurrencyOptions) withDefaults() ConcurrencyOptions {
	if o.Runs == 0 {
		o.Runs = 10_000
	}
	if o.Keys == 0 {
		o.Keys = 100
	}
	if o.Limit == 0 {
		o.Limit = 1
	}
	if o.Callers == 0 {
		o.Callers = 16
	}
	if o.Work == 0 {
		o.Work = 2 * time.Millisecond
	}
	if o.QueueRuns == 0 {
		o.QueueRuns = 3000
	}
	if o.QueueRate == 0 {
		o.QueueRate = 200
	}
	if o.HotRuns == 0 {
		o.HotRuns = 2000
	}
	if o.HotRounds == 0 {
		o.HotRounds = 5
	}
	return o
}

// Workflows of the concurrency benchmark: two steps around the work, one
// limited per key, one declaring nothing.
const (
	limitedWorkflow   = "limited"
	unlimitedWorkflow = "unlimited"
	meteredWorkflow   = "metered"
	meteredQueue      = "metered"
)

// keyInput is a limited run's input: its key.
type keyInput struct {
	Key string `json:"key"`
}

// occupancy is what the workflow itself observes: how many runs of each
// key are between their first and their second step, and the most ever.
type occupancy struct {
	mu      sync.Mutex
	now     map[string]int
	most    map[string]int
	entered atomic.Int64
}

func (o *occupancy) enter(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.now[key]++
	o.most[key] = max(o.most[key], o.now[key])
	o.entered.Add(1)
}

func (o *occupancy) leave(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.now[key]--
}

// maxOver is the most runs of one key observed at once, over every key.
func (o *occupancy) maxOver() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := 0
	for _, n := range o.most {
		m = max(m, n)
	}
	return m
}

// registerOccupancy registers the two workflows: a step that enters the
// key, the work (none in the unlimited one, whose cost is the engine's
// alone), a step that leaves it.
func registerOccupancy(workflows *engine.Workflows, occ *occupancy, opts ConcurrencyOptions) error {
	body := func(work time.Duration) func(ctx context.Context, in keyInput) (struct{}, error) {
		return func(ctx context.Context, in keyInput) (struct{}, error) {
			if _, err := engine.Step(ctx, "enter", func(context.Context, steps.Key) (struct{}, error) {
				occ.enter(in.Key)
				return struct{}{}, nil
			}, nil); err != nil {
				return struct{}{}, err
			}
			time.Sleep(work) // the work the slot guards
			_, err := engine.Step(ctx, "leave", func(context.Context, steps.Key) (struct{}, error) {
				occ.leave(in.Key)
				return struct{}{}, nil
			}, nil)
			return struct{}{}, err
		}
	}
	if _, err := engine.Register(workflows, limitedWorkflow, body(opts.Work), &engine.WorkflowOpts{
		Concurrency: &engine.Concurrency{Key: "key", Limit: opts.Limit},
	}); err != nil {
		return err
	}
	if _, err := engine.Register(workflows, meteredWorkflow, body(0), &engine.WorkflowOpts{Queue: meteredQueue}); err != nil {
		return err
	}
	_, err := engine.Register(workflows, unlimitedWorkflow, body(0), nil)
	return err
}

// Concurrency measures per-key concurrency on pool (a migrated database
// of its own, whose connections counter traces): opts.Runs runs over
// opts.Keys keys of limit opts.Limit, started by a worker's engine (which
// executes the queued ones as slots pass), with the throughput, the most
// runs of one key the workflow itself saw at once, and the most slots of
// one key the runs table showed. Then the hot path of a workflow that
// declares no limit, with the concurrency triggers of the runs table on
// and off in turn: what the feature costs a run that does not use it.
func Concurrency(ctx context.Context, pool *pgxpool.Pool, counter *Counter, opts ConcurrencyOptions, out, progress io.Writer) error {
	opts = opts.withDefaults()
	occ := &occupancy{now: map[string]int{}, most: map[string]int{}}
	workflows := engine.NewWorkflows()
	if err := registerOccupancy(workflows, occ, opts); err != nil {
		return err
	}
	queues := []engine.Queue{{Name: meteredQueue, Rate: engine.Rate{Limit: opts.QueueRate, Period: time.Second}}}
	w, err := worker.New(pool, &worker.Config{Engine: engine.Config{Workflows: workflows, Queues: queues}})
	if err != nil {
		return err
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return w.Stop(ctx)
	}
	defer stop() //nolint:errcheck // on an error already returned

	fmt.Fprintf(progress, "limited: %d runs over %d keys, limit %d\n", opts.Runs, opts.Keys, opts.Limit)
	held := &slotWatch{pool: pool}
	watchCtx, endWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); held.run(watchCtx) }()
	before := counter.Read()
	start := time.Now()
	started, err := Drive(ctx, opts.Callers, opts.Runs, 0, func(ctx context.Context, i int) error {
		input := fmt.Appendf(nil, `{"key": "k%03d"}`, i%opts.Keys)
		_, err := w.Engine().Start(ctx, engine.StartParams{Workflow: limitedWorkflow, IdempotencyKey: fmt.Sprintf("limited-%d", i), Input: input})
		return err
	})
	if err == nil {
		err = awaitFinished(ctx, pool, opts.Runs, progress)
	}
	elapsed := time.Since(start)
	counts := counter.Read().Sub(before)
	endWatch()
	<-watched
	if err != nil {
		return fmt.Errorf("bench: limited runs: %w", err)
	}
	var failed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs WHERE workflow = $1 AND status <> 'succeeded'`, limitedWorkflow).Scan(&failed); err != nil {
		return err
	}
	fmt.Fprintf(out, "limited: %d runs over %d keys, limit %d, %s of work in each, started by %d callers through a worker's engine\n",
		opts.Runs, opts.Keys, opts.Limit, opts.Work, opts.Callers)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "runs\tstarted in\tall finished in\truns/s\tnot succeeded\tmost at once per key (workflow)\tmost slots per key (runs table)\tround trips/run\tcommits/run\t")
	fmt.Fprintf(tw, "%d\t%s\t%s\t%.0f\t%d\t%d\t%s\t%.2f\t%.2f\t\n", opts.Runs, started.Elapsed.Round(time.Millisecond), elapsed.Round(time.Millisecond),
		float64(opts.Runs)/elapsed.Seconds(), failed, occ.maxOver(), held.String(),
		float64(counts.Statements)/float64(opts.Runs), float64(counts.Commits)/float64(opts.Runs))
	if err := tw.Flush(); err != nil {
		return err
	}
	if opts.QueueRuns > 0 {
		if err := metered(ctx, pool, w.Engine(), opts, out, progress); err != nil {
			return err
		}
	}
	if err := stop(); err != nil {
		return err
	}
	if opts.HotRounds < 0 {
		return nil
	}
	return hotPath(ctx, pool, counter, &engine.Config{Workflows: workflows, Queues: queues}, opts, out, progress)
}

// metered starts opts.QueueRuns runs in a queue limited to opts.QueueRate
// starts a second, through the worker's engine, and reports the rate they
// started at and the most starts any one-second window held, from the
// runs table.
func metered(ctx context.Context, pool *pgxpool.Pool, c *engine.Client, opts ConcurrencyOptions, out, progress io.Writer) error {
	fmt.Fprintf(progress, "queue: %d runs, at most %d starts a second\n", opts.QueueRuns, opts.QueueRate)
	var before int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs WHERE finished_at IS NOT NULL`).Scan(&before); err != nil {
		return err
	}
	start := time.Now()
	if _, err := Drive(ctx, opts.Callers, opts.QueueRuns, 0, func(ctx context.Context, i int) error {
		_, err := c.Start(ctx, engine.StartParams{Workflow: meteredWorkflow, IdempotencyKey: fmt.Sprintf("metered-%d", i), Input: []byte(`{"key": "m"}`)})
		return err
	}); err != nil {
		return fmt.Errorf("bench: queued runs: %w", err)
	}
	if err := awaitFinished(ctx, pool, before+opts.QueueRuns, progress); err != nil {
		return fmt.Errorf("bench: queued runs: %w", err)
	}
	elapsed := time.Since(start)
	// The most starts in any window of one second: each start and those
	// less than a second before it, as the limit counts them.
	var most, failed int
	var span float64
	if err := pool.QueryRow(ctx, `
		SELECT coalesce(max(n), 0), coalesce(extract(epoch FROM max(s) - min(s)), 0)::float8,
			(SELECT count(*) FROM ratchet.runs WHERE workflow = $1 AND status <> 'succeeded')
		FROM (SELECT queue_started_at AS s, count(*) OVER (ORDER BY queue_started_at
				RANGE BETWEEN interval '999999 microseconds' PRECEDING AND CURRENT ROW) AS n
			FROM ratchet.runs WHERE workflow = $1) w`, meteredWorkflow).Scan(&most, &span, &failed); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nqueue: %d runs with a rate limit of %d starts a second, started by %d callers, started from the queue by the worker\n",
		opts.QueueRuns, opts.QueueRate, opts.Callers)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "runs\tall finished in\truns/s\tstarts/s (first to last start)\tmost starts in a second\tlimit\tnot succeeded\t")
	rate := "-"
	if span > 0 {
		rate = fmt.Sprintf("%.0f", float64(opts.QueueRuns-1)/span)
	}
	fmt.Fprintf(tw, "%d\t%s\t%.0f\t%s\t%d\t%d\t%d\t\n", opts.QueueRuns, elapsed.Round(time.Millisecond), float64(opts.QueueRuns)/elapsed.Seconds(),
		rate, most, opts.QueueRate, failed)
	return tw.Flush()
}

// awaitFinished waits for n runs to finish, saying how many have every
// few seconds.
func awaitFinished(ctx context.Context, pool *pgxpool.Pool, n int, progress io.Writer) error {
	last := time.Now()
	for {
		var done int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs WHERE finished_at IS NOT NULL`).Scan(&done); err != nil {
			return err
		}
		if done >= n {
			return nil
		}
		if time.Since(last) > 5*time.Second {
			fmt.Fprintf(progress, "  %d of %d finished\n", done, n)
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// slotWatch samples the most slots any key holds, from the runs table.
type slotWatch struct {
	pool    *pgxpool.Pool
	most    int
	samples int
}

func (s *slotWatch) run(ctx context.Context) {
	for ctx.Err() == nil {
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM ratchet.runs WHERE holds_slot GROUP BY tenant, concurrency_key) k`).Scan(&n); err == nil {
			s.most, s.samples = max(s.most, n), s.samples+1
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *slotWatch) String() string { return fmt.Sprintf("%d (%d samples)", s.most, s.samples) }

// concurrencyTriggers are the runs table's triggers of per-key
// concurrency: all a run that declares no key pays for at the database.
var concurrencyTriggers = []string{"runs_drop_finished_slot", "runs_pass_slot"}

// hotPath measures the unlimited workflow started and executed inline by
// a plain engine, with the concurrency triggers on and off in turn.
func hotPath(ctx context.Context, pool *pgxpool.Pool, counter *Counter, cfg *engine.Config, opts ConcurrencyOptions, out, progress io.Writer) error {
	c, err := engine.NewClient(pool, cfg)
	if err != nil {
		return err
	}
	setTriggers := func(on bool) error {
		verb := "DISABLE"
		if on {
			verb = "ENABLE"
		}
		for _, name := range concurrencyTriggers {
			if _, err := pool.Exec(ctx, "ALTER TABLE ratchet.runs "+verb+" TRIGGER "+name); err != nil {
				return fmt.Errorf("bench: %s trigger %s (the benchmark's role owns its scratch database): %w", verb, name, err)
			}
		}
		return nil
	}
	defer setTriggers(true) //nolint:errcheck // the scratch database is dropped next
	configs := []string{"triggers on", "triggers off"}
	byConfig := map[string][]measurement{}
	var ratios []float64
	for round := range opts.HotRounds {
		order := slices.Clone(configs)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, name := range order {
			if err := setTriggers(name == "triggers on"); err != nil {
				return err
			}
			fmt.Fprintf(progress, "no limit, %s, round %d/%d\n", name, round+1, opts.HotRounds)
			before := counter.Read()
			res, err := Drive(ctx, opts.Callers, opts.HotRuns, 0, func(ctx context.Context, i int) error {
				key := fmt.Sprintf("hot-%s-%d-%d", name, round, i)
				res, err := c.Start(ctx, engine.StartParams{Workflow: unlimitedWorkflow, IdempotencyKey: key, Input: []byte(`{"key": "k"}`)})
				if err == nil && res.Run.Status != engine.StatusSucceeded {
					err = fmt.Errorf("run %s ended %s", key, res.Run.Status)
				}
				return err
			})
			if err != nil {
				return fmt.Errorf("bench: no limit, %s: %w", name, err)
			}
			byConfig[name] = append(byConfig[name], measurement{Result: res, counts: counter.Read().Sub(before)})
			fmt.Fprintf(progress, "  %d runs in %s: %.0f runs/s\n", res.Ops, res.Elapsed.Round(time.Millisecond), res.Rate())
		}
		ratios = append(ratios, byConfig["triggers on"][round].Rate()/byConfig["triggers off"][round].Rate())
	}
	slices.Sort(ratios)
	fmt.Fprintf(out, "\nno limit declared: %d runs a measurement, %d rounds, the runs table's concurrency triggers on (as deployed) and off (the table as before per-key concurrency);\n"+
		"rates and latencies are medians of rounds, on/off the median of each round's ratio (with its lowest and highest)\n", opts.HotRuns, opts.HotRounds)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "configuration\truns/s\tp50 ms\tp99 ms\tround trips/run\tcommits/run\ton/off\t")
	for _, name := range configs {
		med, all := median(byConfig[name]), total(byConfig[name])
		ratio := ""
		if name == "triggers on" {
			ratio = fmt.Sprintf("%.3f (%.2f–%.2f)", ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%.2f\t%.2f\t%s\t\n", name, med.Rate(), ms(med.P50), ms(med.P99),
			float64(all.counts.Statements)/float64(all.Ops), float64(all.counts.Commits)/float64(all.Ops), ratio)
	}
	return tw.Flush()
}
