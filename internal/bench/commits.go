package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
	"github.com/ratchet-run/ratchet/worker"
)

// CommitsOptions configure Commits. Zero fields take the defaults given.
type CommitsOptions struct {
	// Concurrencies lists the numbers of callers measured. Defaults to 1,
	// 16 and 64.
	Concurrencies []int
	// Runs is the number of runs (or bare transactions) of one
	// measurement. Defaults to 3000.
	Runs int
	// Rounds is how many measurements each configuration gets per
	// concurrency, in turn, so that drift touches all. Defaults to 5.
	Rounds int
	// Window is the engine's commit window when coalescing. Defaults to
	// engine.DefaultCommitWindow.
	Window time.Duration
	// Configs are the configurations measured, of CommitConfigs. Defaults
	// to all of them.
	Configs []string
}

func (o CommitsOptions) withDefaults() CommitsOptions {
	if len(o.Concurrencies) == 0 {
		o.Concurrencies = []int{1, 16, 64}
	}
	if o.Runs == 0 {
		o.Runs = 3000
	}
	if o.Rounds == 0 {
		o.Rounds = 5
	}
	if o.Window == 0 {
		o.Window = engine.DefaultCommitWindow
	}
	if len(o.Configs) == 0 {
		o.Configs = CommitConfigs
	}
	return o
}

// stepsWorkflow is the workflow Commits drives: three steps that call
// nothing, so that a run is its start, three step results and its finish,
// each one fenced statement — the last step's result in the finish's
// statement unless step results commit alone.
const stepsWorkflow = "steps3"

// Bare is the ceiling a phase commit is measured against: one durable
// transaction per phase, writing what a phase writes at its barest (a
// journal row, the run's recovery point), with no engine around it.
type Bare struct {
	pool    *pgxpool.Pool
	callers int
}

// NewBare makes (or empties) the bare tables, with a run row per caller.
func NewBare(ctx context.Context, pool *pgxpool.Pool, callers int) (*Bare, error) {
	if _, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS bare_runs (id text PRIMARY KEY, point bigint NOT NULL);
		CREATE TABLE IF NOT EXISTS bare_journal (run_id text NOT NULL, seq bigint NOT NULL, PRIMARY KEY (run_id, seq));
		TRUNCATE bare_runs, bare_journal`); err != nil {
		return nil, fmt.Errorf("bench: make the bare tables: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO bare_runs SELECT g::text, 0 FROM generate_series(0, $1::int - 1) g`, callers); err != nil {
		return nil, fmt.Errorf("bench: make the bare tables: %w", err)
	}
	return &Bare{pool: pool, callers: callers}, nil
}

// Tx returns an op writing phase i as BEGIN, INSERT, UPDATE, COMMIT: four
// round trips. Ops of different tags never write the same journal row.
func (b *Bare) Tx(tag int) func(ctx context.Context, i int) error {
	return func(ctx context.Context, i int) error {
		return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO bare_journal VALUES ($1, $2)`, strconv.Itoa(i%b.callers), int64(tag)<<40|int64(i)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE bare_runs SET point = $2 WHERE id = $1`, strconv.Itoa(i%b.callers), i)
			return err
		})
	}
}

// Stmt returns an op writing phase i in one statement: one round trip.
func (b *Bare) Stmt(tag int) func(ctx context.Context, i int) error {
	return func(ctx context.Context, i int) error {
		_, err := b.pool.Exec(ctx, `WITH u AS (UPDATE bare_runs SET point = $2 WHERE id = $1 RETURNING id)
			INSERT INTO bare_journal SELECT id, $3 FROM u`, strconv.Itoa(i%b.callers), i, int64(tag)<<40|int64(i))
		return err
	}
}

// registerSteps registers stepsWorkflow.
func registerSteps(workflows *engine.Workflows) error {
	noop := func(context.Context, steps.Key) (struct{}, error) { return struct{}{}, nil }
	_, err := engine.Register(workflows, stepsWorkflow, func(ctx context.Context, _ struct{}) (struct{}, error) {
		for _, name := range []string{"one", "two", "three"} {
			if _, err := engine.Step(ctx, name, noop, nil); err != nil {
				return struct{}{}, err
			}
		}
		return struct{}{}, nil
	}, nil)
	return err
}

// CommitConfigs are what Commits can measure, in this order in a round
// (reversed every other round).
var CommitConfigs = []string{"bare-tx", "bare-stmt", "alone/steps-apart", "alone", "coalesced/steps-apart", "coalesced"}

// apart names the configuration that differs from name only in committing
// each step's result by itself.
func apart(name string) string {
	base, _, _ := strings.Cut(name, "/")
	return base + "/steps-apart"
}

// engineConfigs are the engine's configurations among CommitConfigs: the
// commit window (negative: coalescing off) and whether each step's result
// commits by itself (engine.Config.CommitStepsAlone, as before the last
// step's result rode with the finish).
var engineConfigs = map[string]struct {
	coalesce, stepsAlone bool
}{
	"alone/steps-apart":     {false, true},
	"alone":                 {false, false},
	"coalesced/steps-apart": {true, true},
	"coalesced":             {true, false},
}

// Commits measures, on pool (a migrated database of its own, whose
// connections counter traces), the rate of phase commits of a workflow of
// three steps with the engine's commit coalescing off and on (each a
// started worker's engine, as in a serve process), against the
// ceiling of one durable transaction per phase measured in the same run:
// a transaction of one INSERT and one UPDATE (BEGIN, INSERT, UPDATE,
// COMMIT: four round trips) and the same as one statement (one round
// trip). It writes a table to out and progress to progress.
func Commits(ctx context.Context, pool *pgxpool.Pool, counter *Counter, opts CommitsOptions, out, progress io.Writer) error {
	opts = opts.withDefaults()
	configs := slices.DeleteFunc(slices.Clone(CommitConfigs), func(name string) bool { return !slices.Contains(opts.Configs, name) })
	for _, name := range opts.Configs {
		if !slices.Contains(CommitConfigs, name) {
			return fmt.Errorf("bench: no configuration %q (want some of %s)", name, strings.Join(CommitConfigs, ", "))
		}
	}
	workflows := engine.NewWorkflows()
	if err := registerSteps(workflows); err != nil {
		return err
	}
	// The engine measured is a started worker's, as in a serve process: its
	// recoverer polls and River runs beside the runs measured. Each
	// configuration's worker runs only during its own measurements.
	fmt.Fprintf(out, "%d runs (or bare transactions) a measurement, %d rounds, commit window %s: rates and latencies are medians of rounds,\n"+
		"the ratios the median of each round's (with its lowest and highest); round trips and commits per run are over all rounds\n"+
		"and include the worker's own background work (polls, River).\n"+
		"A run is a start, three step results (phases) and a finish, started and executed inline by a started worker's engine; a bare transaction writes what one phase does.\n"+
		"steps-apart: each step's result commits by itself (engine.Config.CommitStepsAlone); otherwise the last one commits with the run's finish.\n",
		opts.Runs, opts.Rounds, opts.Window)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "callers\tconfiguration\truns/s\tphases/s\tp50 ms\tp99 ms\tround trips/run\tcommits/run\tstatements/batch\tphases/s ÷ bare-tx/s\tphases/s ÷ bare-stmt/s\truns/s ÷ steps-apart\t")
	for _, conc := range opts.Concurrencies {
		bare, err := NewBare(ctx, pool, conc)
		if err != nil {
			return err
		}
		byConfig := map[string][]measurement{}
		ratios := map[string][]float64{} // config, then what it is divided by
		for round := range opts.Rounds {
			order := slices.Clone(configs)
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, name := range order {
				fmt.Fprintf(progress, "callers=%d %s round %d/%d\n", conc, name, round+1, opts.Rounds)
				var op func(ctx context.Context, i int) error
				stop := func() error { return nil }
				switch name {
				case "bare-tx":
					op = bare.Tx(2 * round)
				case "bare-stmt":
					op = bare.Stmt(2*round + 1)
				default:
					cfg := engineConfigs[name]
					window := time.Duration(-1)
					if cfg.coalesce {
						window = opts.Window
					}
					w, err := worker.New(pool, &worker.Config{Engine: engine.Config{Workflows: workflows, CommitWindow: window, CommitStepsAlone: cfg.stepsAlone}})
					if err != nil {
						return err
					}
					if err := w.Start(ctx); err != nil {
						return err
					}
					stop = func() error {
						ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
						defer cancel()
						return w.Stop(ctx)
					}
					op = func(ctx context.Context, i int) error {
						key := fmt.Sprintf("%s-%d-%d-%d", name, conc, round, i)
						res, err := w.Engine().Start(ctx, engine.StartParams{Workflow: stepsWorkflow, IdempotencyKey: key, Input: []byte(`{}`)})
						if err == nil && res.Run.Status != engine.StatusSucceeded {
							err = fmt.Errorf("run %s ended %s", key, res.Run.Status)
						}
						return err
					}
				}
				before := counter.Read()
				res, err := Drive(ctx, conc, opts.Runs, 0, op)
				counts := counter.Read().Sub(before)
				if err := errors.Join(err, stop()); err != nil {
					return fmt.Errorf("bench: %s at %d callers: %w", name, conc, err)
				}
				byConfig[name] = append(byConfig[name], measurement{Result: res, counts: counts})
				fmt.Fprintf(progress, "  %d in %s: %.0f/s\n", res.Ops, res.Elapsed.Round(time.Millisecond), res.Rate())
			}
			for _, name := range configs {
				if _, ok := engineConfigs[name]; !ok {
					continue
				}
				// Each against what the same round measured.
				rate := byConfig[name][round].Rate()
				for _, by := range []string{"bare-tx", "bare-stmt", apart(name)} {
					if m := byConfig[by]; len(m) > round && by != name {
						if strings.HasPrefix(by, "bare") {
							ratios[name+" "+by] = append(ratios[name+" "+by], 3*rate/m[round].Rate())
						} else {
							ratios[name+" apart"] = append(ratios[name+" apart"], rate/m[round].Rate())
						}
					}
				}
			}
		}
		for _, name := range configs {
			med, all := median(byConfig[name]), total(byConfig[name])
			perRun := func(v int64) string { return fmt.Sprintf("%.2f", float64(v)/float64(all.Ops)) }
			runs, phases, batch := "-", fmt.Sprintf("%.0f", med.Rate()), "-"
			ratio := func(key string) string {
				r := ratios[key]
				if len(r) == 0 {
					return "-"
				}
				slices.Sort(r)
				return fmt.Sprintf("%.2f (%.2f–%.2f)", r[len(r)/2], r[0], r[len(r)-1])
			}
			if _, ok := engineConfigs[name]; ok {
				runs, phases = fmt.Sprintf("%.0f", med.Rate()), fmt.Sprintf("%.0f", 3*med.Rate())
			}
			if all.counts.Batches > 0 {
				batch = fmt.Sprintf("%.1f", float64(all.counts.Batched)/float64(all.counts.Batches))
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", conc, name, runs, phases, ms(med.P50), ms(med.P99),
				perRun(all.counts.Statements), perRun(all.counts.Commits), batch, ratio(name+" bare-tx"), ratio(name+" bare-stmt"), ratio(name+" apart"))
		}
	}
	return tw.Flush()
}
