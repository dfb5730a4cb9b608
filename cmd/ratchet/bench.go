package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oklog/ulid/v2"

	"github.com/ratchet-run/ratchet/internal/bench"
	"github.com/ratchet-run/ratchet/migrations"
)

type benchCmd struct {
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
func (c *benchCmd) Run(e *env) error {
	switch {
	case c.Concurrency < 1, c.Runs < 1, c.Rounds < 1, c.Sustained < 0, c.WarmUp < 0:
		return fmt.Errorf("--concurrency, --runs and --rounds must be positive, --sustained and --warm-up not negative")
	}
	for _, n := range c.Phases {
		if n < 1 || n > 1000 {
			return fmt.Errorf("--phases %d: want 1..1000", n)
		}
	}
	admin, err := c.connect(e.ctx)
	if err != nil {
		return err
	}
	defer admin.Close()
	name := "ratchet_bench_" + strings.ToLower(ulid.Make().String()[16:])
	if _, err := admin.Exec(e.ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create a scratch database for the benchmark (the role needs CREATEDB): %s", reason(err))
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(e.ctx), 30*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			fmt.Fprintf(e.stderr, "ratchet: could not drop scratch database %s: %s\n", name, reason(err))
		}
	}()

	cfg := admin.Config().Copy()
	cfg.ConnConfig.Database = name
	cfg.MaxConns = int32(c.Concurrency) + 8 // the worker's poll and River's own connections
	counter := &bench.Counter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Apply(e.ctx, pool, nil); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "benchmarking in scratch database %s on %s\n", name, c.where())
	return bench.Compare(e.ctx, pool, counter, bench.Options{
		Concurrency: c.Concurrency, Phases: c.Phases, Runs: c.Runs, Rounds: c.Rounds,
		Sustained: c.Sustained, StaleAfter: c.StaleAfter, WarmUp: c.WarmUp,
	}, e.stdout, e.stderr)
}
