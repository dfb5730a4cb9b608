package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oklog/ulid/v2"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratchet-run/ratchet/migrations"
	"github.com/ratchet-run/ratchet/steps"
)

// Defaults for Config.
const (
	DefaultStaleAfter   = 30 * time.Second
	DefaultTenant       = "default"
	DefaultCommitWindow = 500 * time.Microsecond
)

// Config configures a Client. The zero value of every field selects its
// documented default.
type Config struct {
	// Workflows is the registry of workflows this client can run. Required.
	Workflows *Workflows

	// ID names this client as a lease owner in the runs it executes.
	// Defaults to "<hostname>:<pid>:<random>".
	ID string

	// StaleAfter is the lease length: a run whose executor has not
	// heartbeated for this long may be taken over by another. Defaults to
	// DefaultStaleAfter (30s).
	StaleAfter time.Duration

	// HeartbeatInterval is how often a live executor extends its lease.
	// Defaults to StaleAfter/3. Must be shorter than StaleAfter.
	HeartbeatInterval time.Duration

	// KeyFormat is the format of the child keys of the runs this client
	// creates: 0 (the default) for the database's (ratchet.settings: 3
	// for a database whose schema this release created, 1 for one that
	// existed before), 1 (steps.ChildKey), 2 (steps.ChildKeyV2, which
	// names the run, so that finding the run behind a key needs no index of
	// every key sent: less WAL and disk per run) or 3 (steps.ChildKeyV3,
	// which names the request: a run whose creation a failover lost, made
	// again by the client's retry, sends the same keys; one index entry per
	// run). A run keeps its format whichever client executes it. Set 2 or 3
	// once no process of a release that does not know it runs against the
	// database: such a process would send format-1 keys for the run.
	// docs/steps.md.
	KeyFormat int

	// MaxInline bounds the runs this client executes inline at once (the
	// executions Start begins, as the API's requests do). A Start beyond
	// it executes nothing: it creates the run unleased and due at once,
	// for a worker to execute, and returns it pending. It bounds the
	// connections inline executions take (see worker.Config.Connections).
	// Zero: no bound.
	MaxInline int

	// CommitWindow is how long a statement that commits by itself (Start's
	// claim, a step's result, a run's finish) may wait for those of other
	// executions in this process to be sent to Postgres with it: one round
	// trip and one commit for all, each statement's outcome still its own
	// (docs/performance.md).
	// A batch is sent sooner when every execution in progress has joined
	// it, so that a lone execution does not wait. Defaults to
	// DefaultCommitWindow; a negative value sends every statement alone.
	CommitWindow time.Duration

	// CommitStepsAlone commits each step's result by itself before Step
	// returns, as releases before it did. By default a step's result is
	// committed by the run's next commit — the next atomic phase's
	// transaction or the run's finish, when one follows the step — and
	// before any other phase begins: one durable wait less per such step,
	// and nothing downstream sees the result before it is durable
	// (docs/performance.md). Set it when code outside the engine must find
	// the step journaled as soon as Step returns.
	CommitStepsAlone bool

	// Retry says when a run that failed retryably is executed again, and
	// when it gives up, for workflows without a RetryPolicy of their own
	// (WorkflowOpts.Retry). Its zero value retries for ever, waiting 1s
	// doubling to 5 minutes, ±20%.
	Retry RetryPolicy

	// StepPolicy retries external steps that do not set their own. Its zero
	// fields take steps.Policy's defaults (5 attempts within a minute,
	// 100ms doubling to 10s).
	StepPolicy steps.Policy

	// StepTimeout bounds each attempt of an external step that does not set
	// its own. Defaults to 30s.
	StepTimeout time.Duration

	// Hooks observe run and phase boundaries, after the engine's own
	// OpenTelemetry spans. Defaults to none.
	Hooks Hooks

	// TracerProvider makes the run and phase spans. Defaults to
	// OpenTelemetry's global provider (a no-op until one is installed).
	TracerProvider trace.TracerProvider
	// MeterProvider makes the engine's metrics. Defaults to OpenTelemetry's
	// global provider.
	MeterProvider metric.MeterProvider

	// RunGauges reports, on MeterProvider, the unfinished runs by blocked
	// reason, the oldest due-but-untaken age and the longest same-error
	// streak (BlockedSummary, at most every 10s, when metrics are
	// collected). The figures are global: enable them on one process, or
	// aggregate with max. Defaults to off.
	RunGauges bool

	// Queues declares the named queues the workflows' runs may wait in
	// (see Queue). A workflow or a start naming a queue not declared here
	// is refused (ErrUnknownQueue).
	Queues []Queue

	// Schedules declares schedules in code (see Schedule): each is
	// checked by NewClient and put by DeclareSchedules, which a worker
	// calls as it starts.
	Schedules []Schedule

	// Logger receives the engine's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// withDefaults returns a copy of c with every unset field at its default.
func (c *Config) withDefaults() *Config {
	out := *c
	out.Schedules = slices.Clone(c.Schedules) // filled in with their defaults
	if out.ID == "" {
		host, _ := os.Hostname()
		out.ID = host + ":" + strconv.Itoa(os.Getpid()) + ":" + ulid.Make().String()[20:]
	}
	if out.StaleAfter == 0 {
		out.StaleAfter = DefaultStaleAfter
	}
	if out.HeartbeatInterval == 0 {
		out.HeartbeatInterval = out.StaleAfter / 3
	}
	out.Retry = out.Retry.withDefaults()
	out.StepPolicy = out.StepPolicy.WithDefaults()
	if out.StepTimeout == 0 {
		out.StepTimeout = 30 * time.Second
	}
	if out.CommitWindow == 0 {
		out.CommitWindow = DefaultCommitWindow
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return &out
}

func (c *Config) validate() error {
	switch {
	case c.Workflows == nil:
		return errors.New("engine: Config.Workflows is required")
	case c.StaleAfter < 100*time.Millisecond:
		return fmt.Errorf("engine: Config.StaleAfter %s is shorter than 100ms", c.StaleAfter)
	case c.HeartbeatInterval <= 0 || c.HeartbeatInterval >= c.StaleAfter:
		return fmt.Errorf("engine: Config.HeartbeatInterval %s must be positive and shorter than StaleAfter %s", c.HeartbeatInterval, c.StaleAfter)
	case len(c.ID) > 255:
		return errors.New("engine: Config.ID is longer than 255 bytes")
	case c.KeyFormat < 0 || c.KeyFormat > 3:
		return fmt.Errorf("engine: Config.KeyFormat %d: want 1, 2 or 3, or 0 for the database's", c.KeyFormat)
	case c.CommitWindow > time.Second:
		return fmt.Errorf("engine: Config.CommitWindow %s is longer than a second", c.CommitWindow)
	case c.MaxInline < 0:
		return fmt.Errorf("engine: Config.MaxInline %d is negative", c.MaxInline)
	case c.StepTimeout < 0:
		return fmt.Errorf("engine: Config.StepTimeout %s is negative", c.StepTimeout)
	}
	if err := c.Retry.validate(); err != nil {
		return fmt.Errorf("engine: Config.Retry: %w", err)
	}
	return c.StepPolicy.Validate()
}

// Client starts, executes and resumes runs. It is safe for concurrent use.
// Several clients, in one process or many, may share a database.
type Client struct {
	pool      *pgxpool.Pool
	cfg       *Config
	workflows *Workflows
	logger    *slog.Logger
	// beginPhase opens an atomic phase's transaction (see NewClient).
	beginPhase string
	tel        *telemetry
	hooks      Hooks // the telemetry's, then Config.Hooks

	// inline holds a token per inline execution when MaxInline bounds them.
	inline chan struct{}
	// ready rings when this client made work a poll should take at once
	// (buffered 1: a doorbell; see Ready).
	ready chan struct{}
	// queues are Config.Queues by name, and queueOrder their names.
	queues     map[string]*Queue
	queueOrder []string

	// commits sends fenced one-statement commits, coalesced.
	commits *coalescer
	// executing counts the executions in progress (as executions does),
	// read by the coalescer without c.mu.
	executing atomic.Int64

	mu         sync.Mutex
	active     int                     // Start, TakeOver and Continue calls and detached executions in progress
	executions map[*execution]struct{} // executions in progress
	// queueRunning counts, by queue, the runs this client started from
	// their queue (ClaimQueued) whose executions have not ended.
	queueRunning map[string]int
	draining     bool          // Shutdown has begun
	handingOver  bool          // Shutdown's grace has ended
	idle         chan struct{} // made when draining begins; closed when active drops to 0
	idleClosed   bool
}

// NewClient returns a client that uses pool. It does no I/O: the database
// must already be migrated (see package migrations).
func NewClient(pool *pgxpool.Pool, cfg *Config) (*Client, error) {
	if pool == nil {
		return nil, errors.New("engine: nil pool")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tel, err := newTelemetry(cfg.TracerProvider, cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("engine: telemetry: %w", err)
	}
	var hooks Hooks = tel
	if cfg.Hooks != nil {
		hooks = hookChain{tel, cfg.Hooks}
	}
	queues, err := checkQueues(cfg.Queues, cfg.Workflows)
	if err != nil {
		return nil, err
	}
	for i := range cfg.Schedules {
		s := &cfg.Schedules[i]
		if _, err := s.check(); err != nil {
			return nil, err
		}
		if !cfg.Workflows.Has(s.Workflow) {
			return nil, fmt.Errorf("%w %q: workflow %q is not registered", ErrInvalidSchedule, s.Name, s.Workflow)
		}
	}
	var inline chan struct{}
	if cfg.MaxInline > 0 {
		inline = make(chan struct{}, cfg.MaxInline)
	}
	c := &Client{
		pool: pool, cfg: cfg, workflows: cfg.Workflows, logger: cfg.Logger, executions: map[*execution]struct{}{}, inline: inline,
		tel: tel, hooks: hooks, ready: make(chan struct{}, 1), queues: queues, queueRunning: map[string]int{},
		// An executor paused inside a phase's transaction (a "zombie") may
		// hold the run's row lock, and a takeover would wait on it for as
		// long as the pause lasts. Postgres ends a session idle in a
		// transaction for StaleAfter; the zombie's commit then fails. Sent
		// with BEGIN as one simple-protocol message: no extra round trip.
		beginPhase: fmt.Sprintf("BEGIN; SET LOCAL idle_in_transaction_session_timeout = %d", cfg.StaleAfter.Milliseconds()),
	}
	for _, q := range cfg.Queues {
		c.queueOrder = append(c.queueOrder, q.Name)
	}
	c.commits = &coalescer{pool: pool, window: cfg.CommitWindow, executing: &c.executing}
	if cfg.RunGauges {
		mp := cfg.MeterProvider
		if mp == nil {
			mp = otel.GetMeterProvider()
		}
		if err := c.registerRunGauges(mp); err != nil {
			return nil, fmt.Errorf("engine: run gauges: %w", err)
		}
	}
	return c, nil
}

// ID returns the lease owner name of this client.
func (c *Client) ID() string { return c.cfg.ID }

// Workflows returns the client's registry.
func (c *Client) Workflows() *Workflows { return c.workflows }

// Ping reports whether the client can work: the database answers and
// every Ratchet and River migration has been applied (else an error
// wrapping migrations.ErrPending, naming what is missing). It suits a
// readiness probe.
func (c *Client) Ping(ctx context.Context) error {
	if err := c.pool.Ping(ctx); err != nil {
		return fmt.Errorf("engine: database: %w", err)
	}
	return migrations.Check(ctx, c.pool)
}

// keyFormat is the claim's key format argument: Config.KeyFormat, or nil
// for the database's.
func (c *Client) keyFormat() *int {
	if c.cfg.KeyFormat == 0 {
		return nil
	}
	return &c.cfg.KeyFormat
}
