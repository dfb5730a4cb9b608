package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oklog/ulid/v2"

	"github.com/ratchet-run/ratchet/internal/bench"
	"github.com/ratchet-run/ratchet/migrations"
)

// benchCmd groups the benchmarks; "ratchet bench" alone is engines.
type benchCmd struct {
	Engines     benchEnginesCmd     `cmd:"" default:"withargs" help:"Runs per second, round trips, commits and WAL of a plain engine against a worker's (the default)."`
	History     benchHistoryCmd     `cmd:"" help:"WAL, full-page images and bytes per run as history grows, seeding the history by SQL."`
	Commits     benchCommitsCmd     `cmd:"" help:"Phase commits per second with commit coalescing off and on, and step results alone or with the next commit, against one durable transaction per phase."`
	Retention   benchRetentionCmd   `cmd:"" help:"Prune rate at volume, and the hot path's rate with no pruning, paced pruning and pruning flat out."`
	Scale       benchScaleCmd       `cmd:"" help:"Payments over HTTP to 1, 2 and 4 ratchet serve processes against one Postgres: throughput, latency, and where the ceiling is."`
	Concurrency benchConcurrencyCmd `cmd:"" help:"Runs over many keys with a per-key limit and through a rate-limited queue: throughput and how closely the limits held; and what the feature costs a run that declares none."`
}

type benchConcurrencyCmd struct {
	dbFlags
	Runs      int           `name:"runs" default:"10000" help:"Limited runs started."`
	Keys      int           `name:"keys" default:"100" help:"Concurrency keys they are spread over."`
	Limit     int           `name:"limit" default:"1" help:"Each key's limit."`
	Callers   int           `name:"callers" default:"16" help:"Callers starting runs at once."`
	Work      time.Duration `name:"work" default:"2ms" help:"How long a run holds its slot between its two steps."`
	QueueRuns int           `name:"queue-runs" default:"3000" help:"Runs through a queue with a rate limit; 0 skips it."`
	QueueRate int           `name:"queue-rate" default:"200" help:"The queue's rate limit, in starts a second."`
	HotRuns   int           `name:"hot-runs" default:"2000" help:"Runs per measurement of the hot path with no limit declared."`
	HotRounds int           `name:"hot-rounds" default:"5" help:"Measurements of the hot path per configuration, in turn; 0 skips it."`
}

// Run measures per-key concurrency in a database of its own, created on
// the server of --database-url and dropped afterwards.
func (c *benchConcurrencyCmd) Run(e *env) error {
	if c.Runs < 1 || c.Keys < 1 || c.Limit < 1 || c.Callers < 1 || c.Work <= 0 || c.HotRuns < 1 || c.HotRounds < 0 || c.QueueRuns < 0 || c.QueueRate < 1 {
		return fmt.Errorf("--runs, --keys, --limit, --callers, --work, --queue-rate and --hot-runs must be positive, --queue-runs and --hot-rounds not negative")
	}
	pool, counter, done, err := scratchDatabase(e, &c.dbFlags, int32(c.Callers)+8) // the worker's poll and River's connections
	if err != nil {
		return err
	}
	defer done()
	hotRounds, queueRuns := c.HotRounds, c.QueueRuns
	if hotRounds == 0 {
		hotRounds = -1
	}
	if queueRuns == 0 {
		queueRuns = -1
	}
	return bench.Concurrency(e.ctx, pool, counter, bench.ConcurrencyOptions{
		Runs: c.Runs, Keys: c.Keys, Limit: c.Limit, Callers: c.Callers, Work: c.Work, QueueRuns: queueRuns, QueueRate: c.QueueRate, HotRuns: c.HotRuns, HotRounds: hotRounds,
	}, e.stdout, e.stderr)
}

type benchRetentionCmd struct {
	dbFlags
	History     int           `name:"history" default:"1000000" help:"Finished runs seeded by SQL (a million in about 90 s)."`
	Expired     int           `name:"expired" default:"900000" help:"How many of them, the oldest, are past their retention (enough that no pruner runs out; the output says if one did)."`
	PerDay      int           `name:"per-day" default:"5000000" help:"Expired runs a day the paced pruner keeps up with."`
	BatchSize   int           `name:"batch-size" default:"500" help:"Runs deleted per prune statement."`
	Segment     time.Duration `name:"segment" default:"20s" help:"Length of one measurement of the hot path."`
	Rounds      int           `name:"rounds" default:"3" help:"Segments per pruning mode, in turn; medians are shown."`
	Concurrency int           `name:"concurrency" default:"16" help:"Callers starting runs at once."`
}

// Run measures pruning at volume in a database of its own, created on the
// server of --database-url and dropped afterwards.
func (c *benchRetentionCmd) Run(e *env) error {
	if c.History < 1 || c.Expired < 1 || c.Expired > c.History || c.PerDay < 1 || c.BatchSize < 1 || c.Segment <= 0 || c.Rounds < 1 || c.Concurrency < 1 {
		return fmt.Errorf("--history, --expired (at most --history), --per-day, --batch-size, --segment, --rounds and --concurrency must be positive")
	}
	pool, _, done, err := scratchDatabase(e, &c.dbFlags, int32(c.Concurrency)+4)
	if err != nil {
		return err
	}
	defer done()
	return bench.Retention(e.ctx, pool, bench.RetentionOptions{
		History: c.History, Expired: c.Expired, PerDay: c.PerDay, BatchSize: c.BatchSize,
		Segment: c.Segment, Rounds: c.Rounds, Concurrency: c.Concurrency,
	}, e.stdout, e.stderr)
}

type benchCommitsCmd struct {
	dbFlags
	Concurrency []int         `name:"concurrency" default:"1,16,64" help:"Numbers of callers measured."`
	Runs        int           `name:"runs" default:"3000" help:"Runs (or bare transactions) per measurement."`
	Rounds      int           `name:"rounds" default:"5" help:"Measurements per configuration and concurrency, in turn; medians are shown."`
	Window      time.Duration `name:"window" default:"500us" help:"The engine's commit window when coalescing."`
	Configs     []string      `name:"configs" help:"Configurations measured (default all): bare-tx, bare-stmt, alone/steps-apart, alone, coalesced/steps-apart, coalesced."`
}

// Run measures commit coalescing in a database of its own, created on the
// server of --database-url and dropped afterwards.
func (c *benchCommitsCmd) Run(e *env) error {
	if c.Runs < 1 || c.Rounds < 1 || c.Window <= 0 || c.Window > time.Second || len(c.Concurrency) == 0 {
		return fmt.Errorf("--runs and --rounds must be positive, --window within (0, 1s], --concurrency given")
	}
	for _, n := range c.Concurrency {
		if n < 1 || n > 1000 {
			return fmt.Errorf("--concurrency %d: want 1..1000", n)
		}
	}
	pool, counter, done, err := scratchDatabase(e, &c.dbFlags, int32(slices.Max(c.Concurrency))+8) // the worker's poll and River's connections
	if err != nil {
		return err
	}
	defer done()
	return bench.Commits(e.ctx, pool, counter, bench.CommitsOptions{
		Concurrencies: c.Concurrency, Runs: c.Runs, Rounds: c.Rounds, Window: c.Window, Configs: c.Configs,
	}, e.stdout, e.stderr)
}

type benchEnginesCmd struct {
	dbFlags
	Concurrency int           `name:"concurrency" default:"16" help:"Callers starting runs at once."`
	Phases      []int         `name:"phases" default:"1,3,10" help:"Workflow sizes, in no-op atomic phases."`
	Runs        int           `name:"runs" default:"1000" help:"Runs per measurement."`
	Rounds      int           `name:"rounds" default:"5" help:"Measurements per engine and size; the engines alternate and medians are shown."`
	Sustained   time.Duration `name:"sustained" default:"2m" help:"Length of the sustained comparison (3 phases, a worker running throughout); 0 skips it."`
	StaleAfter  time.Duration `name:"stale-after" default:"30s" help:"Lease length of the engines measured."`
	WarmUp      time.Duration `name:"warm-up" default:"5s" help:"Unmeasured run of the plain engine first; 0 skips it."`
}

// Run measures a plain engine client against a worker's in a database of
// its own, created on the server of --database-url and dropped afterwards.
func (c *benchEnginesCmd) Run(e *env) error {
	switch {
	case c.Concurrency < 1, c.Runs < 1, c.Rounds < 1, c.Sustained < 0, c.WarmUp < 0:
		return fmt.Errorf("--concurrency, --runs and --rounds must be positive, --sustained and --warm-up not negative")
	}
	for _, n := range c.Phases {
		if n < 1 || n > 1000 {
			return fmt.Errorf("--phases %d: want 1..1000", n)
		}
	}
	pool, counter, done, err := scratchDatabase(e, &c.dbFlags, int32(c.Concurrency)+8) // the worker's poll and River's own connections
	if err != nil {
		return err
	}
	defer done()
	return bench.Compare(e.ctx, pool, counter, bench.Options{
		Concurrency: c.Concurrency, Phases: c.Phases, Runs: c.Runs, Rounds: c.Rounds,
		Sustained: c.Sustained, StaleAfter: c.StaleAfter, WarmUp: c.WarmUp,
	}, e.stdout, e.stderr)
}

type benchHistoryCmd struct {
	dbFlags
	Sizes          []int         `name:"sizes" default:"0,1000000" help:"History sizes to measure at, in runs, ascending (seeded by SQL, indexes built after the rows: the whole 0,10000000 run took about 10 minutes)."`
	Runs           int           `name:"runs" default:"20000" help:"Runs executed and measured at each size."`
	Concurrency    int           `name:"concurrency" default:"16" help:"Callers starting runs at once."`
	KeyFormats     []int         `name:"key-formats" default:"1,2" help:"Child-key formats measured at each size (engine.Config.KeyFormat)."`
	Duration       time.Duration `name:"duration" help:"Make each measurement last this long instead of --runs runs; the server's checkpoint_timeout measures a whole checkpoint cycle (the steady state)."`
	WALCompression []string      `name:"wal-compression" help:"Repeat each measurement with these values of wal_compression (off, pglz, lz4, zstd), set on the engine's connections; needs a superuser. Default: the server's setting."`
}

// Run measures the cost of a run at growing history sizes in a database of
// its own, created on the server of --database-url and dropped afterwards.
func (c *benchHistoryCmd) Run(e *env) error {
	if c.Concurrency < 1 || c.Runs < 1 || c.Duration < 0 || len(c.Sizes) == 0 || !slices.IsSorted(c.Sizes) || c.Sizes[0] < 0 {
		return fmt.Errorf("--concurrency and --runs must be positive, --duration and --sizes not negative, --sizes ascending")
	}
	if err := checkKeyFormats(c.KeyFormats); err != nil {
		return err
	}
	pool, _, done, err := scratchDatabase(e, &c.dbFlags, int32(c.Concurrency)+2)
	if err != nil {
		return err
	}
	defer done()
	return bench.History(e.ctx, pool, bench.HistoryOptions{Sizes: c.Sizes, Runs: c.Runs, Concurrency: c.Concurrency, KeyFormats: c.KeyFormats,
		Duration: c.Duration, WALCompression: c.WALCompression}, e.stdout, e.stderr)
}

// scratchDatabase creates a migrated database of its own on the server of
// flags, with a pool of conns connections whose statements a counter
// traces; done closes the pool and drops the database.
func scratchDatabase(e *env, flags *dbFlags, conns int32) (*pgxpool.Pool, *bench.Counter, func(), error) {
	c := flags
	admin, err := c.connect(e.ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	name := "ratchet_bench_" + strings.ToLower(ulid.Make().String()[16:])
	if _, err := admin.Exec(e.ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		admin.Close()
		return nil, nil, nil, fmt.Errorf("create a scratch database for the benchmark (the role needs CREATEDB): %s", reason(err))
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(e.ctx), 30*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			fmt.Fprintf(e.stderr, "ratchet: could not drop scratch database %s: %s\n", name, reason(err))
		}
		admin.Close()
	}
	cfg := admin.Config().Copy()
	cfg.ConnConfig.Database = name
	cfg.MaxConns = conns
	counter := &bench.Counter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		drop()
		return nil, nil, nil, err
	}
	done := func() { pool.Close(); drop() }
	if _, err := migrations.Apply(e.ctx, pool, nil); err != nil {
		done()
		return nil, nil, nil, err
	}
	fmt.Fprintf(e.stderr, "benchmarking in scratch database %s on %s\n", name, c.where())
	return pool, counter, done, nil
}

// checkKeyFormats checks a --key-formats flag: each a child-key format
// (engine.Config.KeyFormat).
func checkKeyFormats(formats []int) error {
	for _, f := range formats {
		if f < 1 || f > 3 {
			return fmt.Errorf("--key-formats %d: want 1, 2 or 3", f)
		}
	}
	return nil
}
