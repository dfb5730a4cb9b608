package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ratchet-run/ratchet/engine"
)

// Defaults for Config.
const (
	DefaultPollInterval     = 500 * time.Millisecond
	DefaultMaxExecutions    = 20
	DefaultExecutionTimeout = 10 * time.Minute
	DefaultAnnounceInterval = 5 * time.Second
)

// Config configures a Recoverer. The zero value of every field selects its
// documented default; a nil *Config is valid.
type Config struct {
	// PollInterval is how often the Recoverer looks for due runs (±10%, so
	// that processes started together do not poll together). It bounds how
	// late after its lease expires, or its backoff ends, a run is taken
	// over. Defaults to 500ms; at most 1 minute.
	PollInterval time.Duration
	// MaxExecutions bounds the runs this Recoverer executes at once; a poll
	// claims no more than the free slots, and polls again as soon as one
	// frees while due runs remain. Defaults to 20.
	MaxExecutions int
	// ExecutionTimeout bounds one resumed execution: one that outlasts it
	// is stopped and its run released to be retried after backoff (error
	// code "execution_timeout"). Defaults to 10 minutes.
	ExecutionTimeout time.Duration
	// AnnounceInterval is how often the Recoverer announces the workflow
	// versions its engine client serves (engine.Client.Announce), each
	// announcement lasting three intervals; it withdraws at Stop. Defaults
	// to 5s.
	AnnounceInterval time.Duration
	// Logger receives the Recoverer's logs. Defaults to discarding them.
	Logger *slog.Logger
}

func (c *Config) withDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.PollInterval == 0 {
		out.PollInterval = DefaultPollInterval
	}
	if out.MaxExecutions == 0 {
		out.MaxExecutions = DefaultMaxExecutions
	}
	if out.ExecutionTimeout == 0 {
		out.ExecutionTimeout = DefaultExecutionTimeout
	}
	if out.AnnounceInterval == 0 {
		out.AnnounceInterval = DefaultAnnounceInterval
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return &out
}

func (c *Config) validate() error {
	switch {
	case c.PollInterval < time.Millisecond || c.PollInterval > time.Minute:
		return fmt.Errorf("recovery: PollInterval %s is outside 1ms..1m", c.PollInterval)
	case c.MaxExecutions < 1:
		return fmt.Errorf("recovery: MaxExecutions %d is less than 1", c.MaxExecutions)
	case c.ExecutionTimeout < time.Second:
		return fmt.Errorf("recovery: ExecutionTimeout %s is below 1s", c.ExecutionTimeout)
	case c.AnnounceInterval < 10*time.Millisecond:
		return fmt.Errorf("recovery: AnnounceInterval %s is below 10ms", c.AnnounceInterval)
	}
	return nil
}

// Recoverer finds due runs in the runs table and executes them with an
// engine client: runs whose executor died (lease expired), runs released
// for a retry (backoff over), runs created unleased by StartTx, and runs
// handed over by a process shutting down. Every process that should resume
// runs has one; they share the work through the database alone, with no
// leader and no queue of their own.
type Recoverer struct {
	engine *engine.Client
	cfg    *Config
	logger *slog.Logger

	mu       sync.Mutex
	inFlight int
	stop     context.CancelFunc // ends the poll loop; nil before Start
	loopDone chan struct{}

	freed      chan struct{} // a slot freed (buffered 1: a doorbell)
	executions sync.WaitGroup
}

// New returns a Recoverer that claims and executes runs with c. It does no
// I/O.
func New(c *engine.Client, cfg *Config) (*Recoverer, error) {
	if c == nil {
		return nil, errors.New("recovery: nil engine client")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Recoverer{engine: c, cfg: cfg, logger: cfg.Logger, freed: make(chan struct{}, 1)}, nil
}

// Start begins polling for due runs on a goroutine of its own, until Stop.
// ctx bounds nothing after Start returns: executions must outlive the
// polling, for the engine's Shutdown to finish or hand them over.
func (r *Recoverer) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stop != nil {
		return errors.New("recovery: Recoverer already started")
	}
	ctx, r.stop = context.WithCancel(context.WithoutCancel(ctx))
	r.loopDone = make(chan struct{})
	go r.loop(ctx)
	return nil
}

// Stop ends polling and returns when no further run will be claimed; the
// process's announcement is withdrawn.
// Executions in progress go on: stop the engine client (Client.Shutdown)
// to conclude them, and Wait for them.
func (r *Recoverer) Stop() {
	r.mu.Lock()
	stop, done := r.stop, r.loopDone
	r.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	<-done
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := r.engine.Withdraw(ctx); err != nil {
		r.logger.WarnContext(ctx, "recovery: withdrawing this process's announcement failed; it expires by itself", slog.String("error", err.Error()))
	}
}

// Wait returns when every execution this Recoverer started has concluded,
// or when ctx ends.
func (r *Recoverer) Wait(ctx context.Context) error {
	r.mu.Lock()
	idle := r.inFlight == 0
	r.mu.Unlock()
	if idle {
		return nil
	}
	done := make(chan struct{})
	go func() {
		r.executions.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("recovery: executions still running: %w", ctx.Err())
	}
}

// loop polls every PollInterval, and at once when a slot frees while due
// runs were left unclaimed for want of one.
func (r *Recoverer) loop(ctx context.Context) {
	defer close(r.loopDone)
	backlog := false
	var announced time.Time
	// Schedules: declared (Config.Schedules) until that succeeds, then
	// ticked when the earliest tick falls due — and at every announcement,
	// for schedules other processes put meanwhile.
	declared := false
	var nextTick time.Time
	timer := time.NewTimer(0) // the first poll is at once
	defer timer.Stop()
	// timer.Reset below is safe whether or not the timer fired: since Go
	// 1.23 a reset timer delivers no stale tick.
	for {
		var freed <-chan struct{}
		if backlog {
			freed = r.freed
		}
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-freed:
		case <-r.engine.Ready():
			// A run queued for a concurrency slot is due now, or a
			// queue has a run waiting or room freed.
		}
		if time.Since(announced) >= r.cfg.AnnounceInterval {
			if err := r.engine.Announce(ctx, 3*r.cfg.AnnounceInterval); err != nil && ctx.Err() == nil {
				r.logger.WarnContext(ctx, "recovery: announcing what this process serves failed; will try again", slog.String("error", err.Error()))
			} else {
				announced = time.Now()
			}
			// As often, slots that no pass reached (a raised limit) pass
			// to the runs queued for them.
			if n, err := r.engine.PassFreeSlots(ctx); err != nil && ctx.Err() == nil {
				r.logger.WarnContext(ctx, "recovery: passing free concurrency slots failed; will try again", slog.String("error", err.Error()))
			} else if n > 0 {
				r.logger.InfoContext(ctx, "recovery: passed free concurrency slots to queued runs", slog.Int("runs", n))
			}
			if !declared {
				if err := r.engine.DeclareSchedules(ctx); err != nil && ctx.Err() == nil {
					r.logger.WarnContext(ctx, "recovery: declaring this process's schedules failed; will try again", slog.String("error", err.Error()))
				} else {
					declared = true
				}
			}
			nextTick = time.Time{} // look again
		}
		if !time.Now().Before(nextTick) {
			n, next, err := r.engine.TickSchedules(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				r.logger.WarnContext(ctx, "recovery: ticking schedules failed; will try again", slog.String("error", err.Error()))
			case n > 0:
				r.logger.InfoContext(ctx, "recovery: started the runs of schedules' ticks", slog.Int("runs", n))
			}
			nextTick = next
			if next.IsZero() || err != nil {
				nextTick = time.Now().Add(r.cfg.AnnounceInterval)
			}
		}
		claimed, free, err := r.poll(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, engine.ErrShutdown):
			return
		case err != nil:
			r.logger.WarnContext(ctx, "recovery: looking for due runs failed; will look again", slog.String("error", err.Error()))
		}
		// Every free slot was filled (or none was free): more runs may be
		// due than this process can take, so look again when one frees.
		backlog = err == nil && claimed == free
		timer.Reset(r.jittered())
	}
}

// poll claims as many due runs as there are free execution slots and
// starts executing them. Only the loop calls it, so slots are counted by
// one caller at a time.
func (r *Recoverer) poll(ctx context.Context) (claimed, free int, err error) {
	r.mu.Lock()
	free = r.cfg.MaxExecutions - r.inFlight
	r.mu.Unlock()
	if free <= 0 {
		return 0, 0, nil
	}
	runs, err := r.engine.ClaimDue(ctx, free)
	if err != nil {
		return 0, free, err
	}
	for _, run := range runs {
		r.execute(run)
	}
	if len(runs) < free {
		// The slots left go to runs waiting in queues, as their room
		// allows.
		queued, err := r.engine.ClaimQueued(ctx, free-len(runs))
		for _, run := range queued {
			r.execute(run)
		}
		runs = append(runs, queued...)
		if err != nil {
			return len(runs), free, err
		}
	}
	return len(runs), free, nil
}

// execute continues a claimed run on a goroutine of its own, with a context
// that only its time limit ends: the engine's Shutdown, not the poll loop's
// end, decides when an execution stops (and hands its run over).
func (r *Recoverer) execute(run *engine.Run) {
	r.mu.Lock()
	r.inFlight++
	r.mu.Unlock()
	r.executions.Add(1)
	go func() {
		defer r.executions.Done()
		defer func() {
			r.mu.Lock()
			r.inFlight--
			r.mu.Unlock()
			select {
			case r.freed <- struct{}{}:
			default:
			}
		}()
		ctx, cancel := context.WithTimeoutCause(context.Background(), r.cfg.ExecutionTimeout,
			fmt.Errorf("%w (%s)", engine.ErrExecutionTimeout, r.cfg.ExecutionTimeout))
		defer cancel()
		log := r.logger.With(slog.String("run_id", run.ID), slog.Int64("lease_token", run.LeaseToken),
			slog.String("recovery_point", run.RecoveryPoint), slog.Int("attempt", run.Attempt))
		final, err := r.engine.Continue(ctx, run)
		switch {
		case errors.Is(err, engine.ErrShutdown), errors.Is(err, engine.ErrLeaseLost):
			// Handed over, or superseded: whoever holds the run now
			// continues it. The engine logged which.
		case err != nil:
			log.WarnContext(ctx, "recovered execution cut short", slog.String("error", err.Error()))
		default:
			log.InfoContext(ctx, "executed due run", slog.String("status", string(final.Status)))
		}
	}()
}

// jittered is the poll interval ±10%.
func (r *Recoverer) jittered() time.Duration {
	d := r.cfg.PollInterval
	return d - d/10 + rand.N(d/5+1)
}
