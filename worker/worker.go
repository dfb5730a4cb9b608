package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/schema"
	"github.com/ratchet-run/ratchet/migrations"
	"github.com/ratchet-run/ratchet/recovery"
)

// Defaults for Config.
const (
	DefaultQueue             = "ratchet"
	DefaultFetchPollInterval = 500 * time.Millisecond
	DefaultPruneInterval     = time.Minute
	DefaultShutdownGrace     = 5 * time.Second
	DefaultJobTimeout        = 10 * time.Second
)

// Config configures a Worker. The zero value of every field but Engine
// selects its documented default.
type Config struct {
	// Engine configures the process's engine client. Engine.Workflows is
	// required.
	Engine engine.Config

	// InsertOnly makes a worker that resumes no runs and works no jobs:
	// its River client only inserts (an outbox's jobs, in a phase's
	// transaction). For API-only processes.
	InsertOnly bool

	// Recovery tunes how this process finds and resumes due runs (crashed,
	// released for a retry, created unleased or handed over): how often it
	// polls, how many it executes at once, how long one may take. Its
	// Logger defaults to the worker's.
	Recovery recovery.Config
	// ShutdownGrace is how long Stop lets executions finish before handing
	// their runs over to other processes. Defaults to 5s.
	ShutdownGrace time.Duration

	// Queue is the River queue of Ratchet's own job (pruning). Defaults to
	// "ratchet".
	Queue string
	// PruneInterval is how often River's leader prunes expired runs.
	// Defaults to 1 minute.
	PruneInterval time.Duration
	// PruneBatchSize is the number of runs deleted per statement. Defaults
	// to 500.
	PruneBatchSize int

	// Workers holds the application's own River workers (an outbox's
	// delivery, say) to be worked by this process's River client beside
	// Ratchet's. Defaults to none.
	Workers *river.Workers
	// Queues are the application's own River queues. Ratchet's queue is
	// added to them.
	Queues map[string]river.QueueConfig
	// FetchPollInterval is how often River polls for the application's
	// jobs, beside its notifications. Defaults to 500ms.
	FetchPollInterval time.Duration
	// PollOnly makes River poll (every FetchPollInterval) instead of
	// holding a LISTEN connection, for a pool behind a transaction pooler
	// such as PgBouncer, which cannot keep a session's LISTEN. New jobs
	// then wait up to FetchPollInterval; Ratchet's own recovery polls
	// anyway. docs/performance.md, "Connections and PgBouncer".
	PollOnly bool
	// JobTimeout bounds a River job whose worker sets no Timeout of its
	// own. Defaults to 10s.
	JobTimeout time.Duration
	// RescueStuckJobsAfter is how long a River job may stay running before
	// River's leader deems its process dead and retries it, if the job's
	// own timeout has passed as well (River jobs hold no lease). Defaults
	// to JobTimeout; it may not be shorter. docs/recovery.md gives the
	// worst-case redelivery delay this implies.
	RescueStuckJobsAfter time.Duration

	// Logger receives the worker's and River's logs. Defaults to the
	// engine's logger, else discarding.
	Logger *slog.Logger
}

// Connections returns how many database connections a process with this
// configuration may hold at once, to size its pool (pgxpool's
// pool_max_conns) so that no execution waits for one:
//
//   - one per execution in progress, for its phase's transaction: the
//     engine's inline executions (Engine.MaxInline; none counted when it
//     is zero, which leaves them unbounded) and the resumed ones
//     (Recovery.MaxExecutions), and a quarter as many again, at least
//     two, for heartbeats sent while a phase holds its connection;
//   - one for the recoverer's poll;
//   - River's: its LISTEN connection (none with PollOnly; counted
//     anyway), two for its leader's maintenance
//     and its producers' fetches, and one per worker of every queue
//     (Ratchet's and Config.Queues'), since a job may query as it works.
//
// An insert-only worker counts its inline executions and the heartbeats
// alone. Requests that only read (GET a run) take a connection briefly
// and share the headroom.
func (c *Config) Connections() int {
	cfg := c.withDefaults()
	rec := cfg.Recovery
	if rec.MaxExecutions == 0 {
		rec.MaxExecutions = recovery.DefaultMaxExecutions
	}
	executions := cfg.Engine.MaxInline
	if !cfg.InsertOnly {
		executions += rec.MaxExecutions
	}
	n := executions + max(executions/4, 2)
	if cfg.InsertOnly {
		return n
	}
	n += 1 + 3 + 1 // the poll; River's LISTEN, maintenance, fetches; Ratchet's queue
	for _, q := range cfg.Queues {
		n += q.MaxWorkers
	}
	return n
}

func (c *Config) withDefaults() *Config {
	out := *c
	out.Queue = cmp.Or(out.Queue, DefaultQueue)
	out.FetchPollInterval = cmp.Or(out.FetchPollInterval, DefaultFetchPollInterval)
	out.PruneInterval = cmp.Or(out.PruneInterval, DefaultPruneInterval)
	out.PruneBatchSize = cmp.Or(out.PruneBatchSize, 500)
	out.ShutdownGrace = cmp.Or(out.ShutdownGrace, DefaultShutdownGrace)
	out.JobTimeout = cmp.Or(out.JobTimeout, DefaultJobTimeout)
	out.RescueStuckJobsAfter = cmp.Or(out.RescueStuckJobsAfter, out.JobTimeout)
	if out.Logger == nil {
		out.Logger = out.Engine.Logger
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	if out.Engine.Logger == nil {
		out.Engine.Logger = out.Logger
	}
	return &out
}

func (c *Config) validate() error {
	switch {
	case c.FetchPollInterval < time.Millisecond:
		return fmt.Errorf("worker: FetchPollInterval %s is below 1ms", c.FetchPollInterval)
	case c.PruneInterval < time.Second:
		return fmt.Errorf("worker: PruneInterval %s is below 1s", c.PruneInterval)
	case c.JobTimeout < time.Second:
		return fmt.Errorf("worker: JobTimeout %s is below 1s", c.JobTimeout)
	case c.RescueStuckJobsAfter < c.JobTimeout:
		return fmt.Errorf("worker: RescueStuckJobsAfter %s is shorter than JobTimeout %s", c.RescueStuckJobsAfter, c.JobTimeout)
	case c.ShutdownGrace < 0, c.PruneBatchSize < 0:
		return errors.New("worker: negative setting")
	}
	return nil
}

// Worker is one process's engine client, recoverer and River client.
type Worker struct {
	pool      *pgxpool.Pool
	cfg       *Config
	logger    *slog.Logger
	river     *river.Client[pgx.Tx]
	engine    *engine.Client
	recoverer *recovery.Recoverer // nil for an insert-only worker
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
	var err error
	if w.engine, err = engine.NewClient(pool, &cfg.Engine); err != nil {
		return nil, err
	}
	if !cfg.InsertOnly {
		rc := cfg.Recovery
		if rc.Logger == nil {
			rc.Logger = cfg.Logger
		}
		w.recoverer, err = recovery.New(w.engine, &rc)
		if err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
	}

	workers := cfg.Workers
	if workers == nil {
		workers = river.NewWorkers()
	}
	if err := river.AddWorkerSafely(workers, &pruneWorker{w: w}); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	riverCfg := &river.Config{
		// River's client id is the engine's lease owner name (River allows
		// 100 characters), so a job's attempted_by and a run's lease_owner
		// name the same process, and so does river_leader.
		ID:                   w.engine.ID()[:min(len(w.engine.ID()), 100)],
		Schema:               migrations.Schema,
		Workers:              workers,
		Logger:               cfg.Logger,
		FetchPollInterval:    cfg.FetchPollInterval,
		PollOnly:             cfg.PollOnly,
		FetchCooldown:        min(river.FetchCooldownDefault, cfg.FetchPollInterval),
		JobTimeout:           cfg.JobTimeout,
		RescueStuckJobsAfter: cfg.RescueStuckJobsAfter,
		// Spans and metrics for every job, and trace context carried from
		// the inserting transaction's span to the job's work span (as a
		// link).
		Middleware: []rivertype.Middleware{otelriver.NewMiddleware(&otelriver.MiddlewareConfig{
			EnableTracePropagation:      true,
			EnableWorkSpanJobKindSuffix: true,
			TracerProvider:              cfg.Engine.TracerProvider,
			MeterProvider:               cfg.Engine.MeterProvider,
		})},
	}
	if !cfg.InsertOnly {
		riverCfg.Queues = map[string]river.QueueConfig{cfg.Queue: {MaxWorkers: 1}}
		for name, q := range cfg.Queues {
			if name == cfg.Queue {
				return nil, fmt.Errorf("worker: queue %q is Ratchet's", name)
			}
			riverCfg.Queues[name] = q
		}
		riverCfg.PeriodicJobs = []*river.PeriodicJob{
			river.NewPeriodicJob(river.PeriodicInterval(cfg.PruneInterval),
				func() (river.JobArgs, *river.InsertOpts) { return pruneArgs{}, &river.InsertOpts{Queue: cfg.Queue} },
				&river.PeriodicJobOpts{RunOnStart: true}),
		}
	}
	if w.river, err = river.NewClient(riverpgxv5.New(pool), riverCfg); err != nil {
		return nil, fmt.Errorf("worker: river client: %w", err)
	}
	return w, nil
}

// Engine returns the process's engine client.
func (w *Worker) Engine() *engine.Client { return w.engine }

// River returns the process's River client, for the application's own
// jobs: the transactional outbox is InsertTx with the transaction of an
// atomic phase, so the job exists if and only if the phase commits. Its
// jobs live in Ratchet's schema (migrations.Schema, "ratchet"), beside
// River's tables that migrations.Apply creates; the workers of their kinds
// go in Config.Workers and their queues in Config.Queues. An insert-only
// worker's client inserts but works nothing.
func (w *Worker) River() *river.Client[pgx.Tx] { return w.river }

// Start begins resuming due runs and working jobs (nothing, for an
// insert-only worker). Work continues until Stop; ctx only bounds starting.
func (w *Worker) Start(ctx context.Context) error {
	if w.cfg.InsertOnly {
		return nil
	}
	if err := w.river.Start(ctx); err != nil {
		return fmt.Errorf("worker: start river: %w", schema.NotMigrated(err, engine.ErrNotMigrated))
	}
	return w.recoverer.Start(ctx)
}

// Stop shuts the process's work down gracefully: it stops looking for due
// runs, fetching jobs and starting runs, lets executions in progress
// (inline ones included) run for up to ShutdownGrace, or until ctx ends if
// that is sooner, then hands the rest over so that other processes continue
// them at once. It returns when everything has stopped, or soon after ctx
// ends with an error saying what had not.
func (w *Worker) Stop(ctx context.Context) error {
	riverStopped := make(chan error, 1)
	if w.cfg.InsertOnly {
		riverStopped <- nil
	} else {
		w.recoverer.Stop()
		go func() { riverStopped <- w.river.Stop(ctx) }()
	}
	grace, cancel := context.WithTimeout(ctx, w.cfg.ShutdownGrace)
	defer cancel()
	errs := []error{w.engine.Shutdown(grace)}
	if w.recoverer != nil {
		// Executions claimed as Shutdown began hand their runs over.
		errs = append(errs, w.recoverer.Wait(ctx))
	}
	var riverErr error
	select {
	case riverErr = <-riverStopped:
	case <-ctx.Done():
		select {
		case riverErr = <-riverStopped:
		default:
			riverErr = ctx.Err()
		}
	}
	if riverErr != nil && !errors.Is(riverErr, context.Canceled) {
		errs = append(errs, fmt.Errorf("worker: stop river: %w", riverErr))
	}
	return errors.Join(errs...)
}
