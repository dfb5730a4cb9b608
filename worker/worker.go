package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/migrations"
	"github.com/ratchet-run/ratchet/recovery"
)

// Defaults for Config.
const (
	DefaultQueue             = "ratchet"
	DefaultMaxWorkers        = 20
	DefaultFetchPollInterval = 500 * time.Millisecond
	DefaultSweepInterval     = 30 * time.Second
	DefaultPruneInterval     = time.Minute
	DefaultExecutionTimeout  = 10 * time.Minute
	DefaultShutdownGrace     = 5 * time.Second
)

// Config configures a Worker. The zero value of every field but Engine
// selects its documented default.
type Config struct {
	// Engine configures the process's engine client. Engine.Workflows is
	// required; Engine.Scheduler is set by New.
	Engine engine.Config

	// InsertOnly makes a worker that schedules looks for the runs its
	// engine claims but works no jobs: for API-only processes.
	InsertOnly bool

	// Queue is the River queue of Ratchet's jobs. Defaults to "ratchet".
	Queue string
	// MaxWorkers bounds the jobs this process works at once (each resumed
	// run is one). Defaults to 20.
	MaxWorkers int
	// FetchPollInterval is how often the process polls for due jobs. It
	// bounds how late after its lease expires a run is taken over.
	// Defaults to 500ms.
	FetchPollInterval time.Duration
	// SweepInterval is how often the leader looks for unfinished runs that
	// have no scheduled look (e.g. created before any worker ran). Defaults
	// to 30s.
	SweepInterval time.Duration
	// SweepBatchSize bounds the runs scheduled per sweep. Defaults to 1000.
	SweepBatchSize int
	// StuckLookAfter is how long a look may stay running on the current
	// lease before the sweep deems its process dead and schedules another.
	// A look takes milliseconds unless it takes the run over, which
	// replaces the lease. Defaults to 10s.
	StuckLookAfter time.Duration
	// PruneInterval is how often the leader prunes expired runs. Defaults
	// to 1 minute.
	PruneInterval time.Duration
	// PruneBatchSize is the number of runs deleted per statement. Defaults
	// to 500.
	PruneBatchSize int
	// ExecutionTimeout bounds one resumed execution (a River job's timeout;
	// River rescues a job only after it). An execution cut short is
	// abandoned and resumed again once its lease is stale. Defaults to 10
	// minutes.
	ExecutionTimeout time.Duration
	// ShutdownGrace is how long Stop lets executions finish before handing
	// their runs over to other processes. Defaults to 5s.
	ShutdownGrace time.Duration

	// Workers holds the application's own River workers (an outbox's
	// delivery, say) to be worked by this process's River client beside
	// Ratchet's. Defaults to none.
	Workers *river.Workers
	// Queues are the application's own River queues. Ratchet's queue is
	// added to them.
	Queues map[string]river.QueueConfig
	// RescueStuckJobsAfter is when River retries a job still running in a
	// process that died (River jobs hold no lease). Defaults to
	// ExecutionTimeout plus a minute; Ratchet's runs never wait for it.
	RescueStuckJobsAfter time.Duration

	// Logger receives the worker's and River's logs. Defaults to the
	// engine's logger, else discarding.
	Logger *slog.Logger
}

func (c *Config) withDefaults() *Config {
	out := *c
	out.Queue = cmpOr(out.Queue, DefaultQueue)
	out.MaxWorkers = cmpOr(out.MaxWorkers, DefaultMaxWorkers)
	out.FetchPollInterval = cmpOr(out.FetchPollInterval, DefaultFetchPollInterval)
	out.SweepInterval = cmpOr(out.SweepInterval, DefaultSweepInterval)
	out.SweepBatchSize = cmpOr(out.SweepBatchSize, 1000)
	out.StuckLookAfter = cmpOr(out.StuckLookAfter, 10*time.Second)
	out.PruneInterval = cmpOr(out.PruneInterval, DefaultPruneInterval)
	out.PruneBatchSize = cmpOr(out.PruneBatchSize, 500)
	out.ExecutionTimeout = cmpOr(out.ExecutionTimeout, DefaultExecutionTimeout)
	out.ShutdownGrace = cmpOr(out.ShutdownGrace, DefaultShutdownGrace)
	if out.Logger == nil {
		out.Logger = out.Engine.Logger
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if out.Engine.Logger == nil {
		out.Engine.Logger = out.Logger
	}
	return &out
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func (c *Config) validate() error {
	switch {
	case c.MaxWorkers < 1:
		return fmt.Errorf("worker: MaxWorkers %d is less than 1", c.MaxWorkers)
	case c.FetchPollInterval < time.Millisecond:
		return fmt.Errorf("worker: FetchPollInterval %s is below 1ms", c.FetchPollInterval)
	case c.SweepInterval < time.Second:
		return fmt.Errorf("worker: SweepInterval %s is below 1s", c.SweepInterval)
	case c.PruneInterval < time.Second:
		return fmt.Errorf("worker: PruneInterval %s is below 1s", c.PruneInterval)
	case c.ExecutionTimeout < time.Second:
		return fmt.Errorf("worker: ExecutionTimeout %s is below 1s", c.ExecutionTimeout)
	case c.ShutdownGrace < 0, c.StuckLookAfter < 0, c.SweepBatchSize < 0, c.PruneBatchSize < 0, c.RescueStuckJobsAfter < 0:
		return errors.New("worker: negative setting")
	}
	return nil
}

// Worker is one process's River client and engine client.
type Worker struct {
	pool   *pgxpool.Pool
	cfg    *Config
	logger *slog.Logger
	river  *river.Client[pgx.Tx]
	sched  *scheduler
	engine *engine.Client
}

// New returns a worker over pool, which must be migrated. It does no I/O.
func New(pool *pgxpool.Pool, cfg *Config) (*Worker, error) {
	if cfg == nil {
		return nil, errors.New("worker: nil config")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	w := &Worker{pool: pool, cfg: cfg, logger: cfg.Logger}

	workers := cfg.Workers
	if workers == nil {
		workers = river.NewWorkers()
	}
	resume := &resumeWorker{timeout: cfg.ExecutionTimeout}
	river.AddWorker(workers, resume)
	river.AddWorker(workers, &sweepWorker{w: w})
	river.AddWorker(workers, &pruneWorker{w: w})
	riverCfg := &river.Config{
		Schema:               migrations.Schema,
		Workers:              workers,
		Logger:               cfg.Logger,
		FetchPollInterval:    cfg.FetchPollInterval,
		FetchCooldown:        min(river.FetchCooldownDefault, cfg.FetchPollInterval),
		RescueStuckJobsAfter: cmpOr(cfg.RescueStuckJobsAfter, cfg.ExecutionTimeout+time.Minute),
		// Spans and metrics for every job, and trace context carried from
		// the inserting transaction's span to the job's work span (as a
		// link): a resumed run's spans lead back to its claim.
		Middleware: []rivertype.Middleware{otelriver.NewMiddleware(&otelriver.MiddlewareConfig{
			EnableTracePropagation:      true,
			EnableWorkSpanJobKindSuffix: true,
			TracerProvider:              cfg.Engine.TracerProvider,
			MeterProvider:               cfg.Engine.MeterProvider,
		})},
	}
	// Jobs that set no timeout of their own get a minute; River insists on
	// rescuing no sooner than that.
	riverCfg.JobTimeout = min(time.Minute, riverCfg.RescueStuckJobsAfter)
	if !cfg.InsertOnly {
		riverCfg.Queues = map[string]river.QueueConfig{cfg.Queue: {MaxWorkers: cfg.MaxWorkers}}
		for name, q := range cfg.Queues {
			if name == cfg.Queue {
				return nil, fmt.Errorf("worker: queue %q is Ratchet's", name)
			}
			riverCfg.Queues[name] = q
		}
		riverCfg.PeriodicJobs = []*river.PeriodicJob{
			river.NewPeriodicJob(river.PeriodicInterval(cfg.SweepInterval),
				func() (river.JobArgs, *river.InsertOpts) { return sweepArgs{}, &river.InsertOpts{Queue: cfg.Queue} },
				&river.PeriodicJobOpts{RunOnStart: true}),
			river.NewPeriodicJob(river.PeriodicInterval(cfg.PruneInterval),
				func() (river.JobArgs, *river.InsertOpts) { return pruneArgs{}, &river.InsertOpts{Queue: cfg.Queue} },
				&river.PeriodicJobOpts{RunOnStart: true}),
		}
	}
	rc, err := river.NewClient(riverpgxv5.New(pool), riverCfg)
	if err != nil {
		return nil, fmt.Errorf("worker: river client: %w", err)
	}
	w.river = rc
	w.sched = &scheduler{river: rc, queue: cfg.Queue}

	engineCfg := cfg.Engine
	engineCfg.Scheduler = w.sched
	w.engine, err = engine.NewClient(pool, &engineCfg)
	if err != nil {
		return nil, err
	}
	resume.rec = recovery.New(w.engine, cfg.Logger)
	return w, nil
}

// Engine returns the process's engine client: claims made through it
// schedule their looks.
func (w *Worker) Engine() *engine.Client { return w.engine }

// Start begins working jobs (nothing, for an insert-only worker). Work
// continues until Stop; ctx only bounds starting.
func (w *Worker) Start(ctx context.Context) error {
	if w.cfg.InsertOnly {
		return nil
	}
	if err := w.river.Start(ctx); err != nil {
		return fmt.Errorf("worker: start river: %w", err)
	}
	return nil
}

// Stop shuts the process's work down gracefully: it stops fetching jobs
// and starting runs, lets executions in progress (inline ones included)
// run for up to ShutdownGrace, then hands the rest over so that other
// processes continue them at once. It returns when everything has stopped
// or ctx ends.
func (w *Worker) Stop(ctx context.Context) error {
	riverStopped := make(chan error, 1)
	if w.cfg.InsertOnly {
		riverStopped <- nil
	} else {
		go func() { riverStopped <- w.river.Stop(ctx) }()
	}
	grace, cancel := context.WithTimeout(ctx, w.cfg.ShutdownGrace)
	defer cancel()
	if err := w.engine.Shutdown(grace); err != nil {
		return err
	}
	select {
	case err := <-riverStopped:
		if err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("worker: stop river: %w", err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
