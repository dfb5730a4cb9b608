package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// Queue is a named queue of runs (docs/queues.md): a run of a workflow
// in a queue (WorkflowOpts.Queue, StartParams.Queue) is created waiting in
// it, executes nothing inline, and starts when the queue has room — fewer
// of its runs executing than Concurrency across every process, fewer
// started in the last Rate.Period than Rate.Limit, the claiming process
// under PerProcess — highest StartParams.Priority first, then in creation
// order. Workers start queued runs as they poll (recovery.Recoverer).
//
// A queue is declared in the code of each process (Config.Queues); the
// limits are enforced in Postgres from the runs table, so processes with
// the same declaration share them exactly, and a process that dies frees
// its room as its runs are resumed and finish. A queue spans tenants: it
// models a downstream's capacity, which tenants share.
type Queue struct {
	// Name is the queue's name: 1..255 letters, digits, '.', '-' or '_'.
	Name string
	// Concurrency bounds the queue's runs executing at once across every
	// process: started and unfinished, parked ones included (a run that
	// sleeps in a queue keeps its room). 0: no bound.
	Concurrency int
	// Rate bounds how often the queue's runs start. Zero: no bound.
	Rate Rate
	// PerProcess bounds the queue's runs one process's worker executes at
	// once (those it starts from the queue and those it resumes). 0: no
	// bound but the worker's.
	PerProcess int
}

// Rate is a rate limit: at most Limit starts in any window of Period.
type Rate struct {
	Limit  int
	Period time.Duration
}

func (q *Queue) validate() error {
	switch {
	case !validName(q.Name):
		return fmt.Errorf("engine: queue name %q: want 1..255 letters, digits, '.', '-' or '_'", q.Name)
	case q.Concurrency < 0:
		return fmt.Errorf("engine: queue %q: Concurrency %d is negative", q.Name, q.Concurrency)
	case q.PerProcess < 0:
		return fmt.Errorf("engine: queue %q: PerProcess %d is negative", q.Name, q.PerProcess)
	case q.Rate.Limit < 0:
		return fmt.Errorf("engine: queue %q: Rate.Limit %d is negative", q.Name, q.Rate.Limit)
	case q.Rate.Limit > 0 && q.Rate.Period < time.Millisecond:
		return fmt.Errorf("engine: queue %q: Rate.Period %s: want 1ms or more with a Rate.Limit", q.Name, q.Rate.Period)
	case q.Rate.Limit == 0 && q.Rate.Period != 0:
		return fmt.Errorf("engine: queue %q: Rate.Period %s without a Rate.Limit", q.Name, q.Rate.Period)
	}
	return nil
}

// checkQueues checks the declared queues and the workflows naming them, and
// indexes them by name.
func checkQueues(declared []Queue, workflows *Workflows) (map[string]*Queue, error) {
	byName := make(map[string]*Queue, len(declared))
	for i := range declared {
		q := declared[i]
		if err := q.validate(); err != nil {
			return nil, err
		}
		if byName[q.Name] != nil {
			return nil, fmt.Errorf("engine: queue %q declared twice", q.Name)
		}
		byName[q.Name] = &q
	}
	for _, def := range workflows.all() {
		if q := def.queue(); q != "" && byName[q] == nil {
			return nil, fmt.Errorf("%w: workflow %q names queue %q, which Config.Queues does not declare", ErrUnknownQueue, def.Name(), q)
		}
	}
	return byName, nil
}

// runQueue is the queue a start's run waits in, or nil.
func (c *Client) runQueue(def definition, p StartParams) (*string, error) {
	name := p.Queue
	if name == "" {
		name = def.queue()
	}
	if name == "" {
		if p.Priority != 0 {
			return nil, fmt.Errorf("%w for workflow %q: a priority without a queue", ErrInvalidInput, def.Name())
		}
		return nil, nil
	}
	if c.queues[name] == nil {
		return nil, fmt.Errorf("%w: %q (workflow %q)", ErrUnknownQueue, name, def.Name())
	}
	return &name, nil
}

// startQueuedSQL starts up to $6 runs waiting in a queue for this client
// (migration 0016).
const startQueuedSQL = `SELECT ` + runColumns + ` FROM ratchet.start_queued($1, $2, $3, $4::interval, $5, $6, $7, $8::interval)`

// ClaimQueued starts up to limit runs waiting in the declared queues, as
// each queue's room allows, and leases them to this client, as ClaimDue
// does: each returned run must be passed to Continue. A queue's runs come
// in the order they left it. The queues are
// tried in an order that changes each call, so that one busy queue does
// not starve the others of the limit. One statement per queue with
// waiting runs or room; none without queues.
func (c *Client) ClaimQueued(ctx context.Context, limit int) ([]*Run, error) {
	if limit < 1 {
		return nil, fmt.Errorf("engine: ClaimQueued limit %d is less than 1", limit)
	}
	if len(c.queueOrder) == 0 {
		return nil, nil
	}
	c.mu.Lock()
	draining := c.draining
	c.mu.Unlock()
	if draining {
		return nil, ErrShutdown
	}
	var out []*Run
	first := rand.N(len(c.queueOrder))
	for i := range c.queueOrder {
		q := c.queues[c.queueOrder[(first+i)%len(c.queueOrder)]]
		n := limit - len(out)
		if q.PerProcess > 0 {
			n = min(n, q.PerProcess-c.startedHere(q.Name))
		}
		if n <= 0 {
			continue
		}
		sent := time.Now()
		rows, err := c.pool.Query(ctx, startQueuedSQL, q.Name, q.Concurrency, q.Rate.Limit, q.Rate.Period, q.PerProcess, n, c.cfg.ID, c.cfg.StaleAfter)
		if err != nil {
			return out, fmt.Errorf("engine: start queued runs of %q: %w", q.Name, notMigrated(err))
		}
		runs, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[Run])
		if err != nil {
			return out, fmt.Errorf("engine: start queued runs of %q: %w", q.Name, err)
		}
		for _, run := range runs {
			run.claimSent = sent
			c.countStarted(run, 1)
		}
		out = append(out, runs...)
		if len(out) >= limit {
			break
		}
	}
	return out, nil
}

// startedHere is how many runs of the queue this client claimed
// (ClaimQueued, ClaimDue) and executes, or is about to.
func (c *Client) startedHere(queue string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.queueRunning[queue]
}

// countStarted counts a claimed run of a queue in (delta 1) or, as its
// Continue ends, out (-1) of the queue's runs executing here.
func (c *Client) countStarted(run *Run, delta int) {
	if run.Queue == nil {
		return
	}
	c.mu.Lock()
	c.queueRunning[*run.Queue] += delta
	run.startedHere = delta > 0
	c.mu.Unlock()
}

// Ready rings when this client made work that a poll should take at once
// rather than at its next interval: a concurrency slot it gave up passed
// to a queued run, which is due now; a run entered a queue; or a run of a
// queue finished, making room in it. A worker's recoverer polls on it;
// other processes find the work at their own intervals.
func (c *Client) Ready() <-chan struct{} { return c.ready }

// ring rings Ready.
func (c *Client) ring() {
	select {
	case c.ready <- struct{}{}:
	default:
	}
}

// requeueSQL puts back in its queue a run claimed before it started from
// it (a TakeOver): its lease released with a new token, still waiting.
const requeueSQL = `
UPDATE ratchet.runs SET
	status = 'pending',
	lease_token = lease_token + 1,
	lease_owner = NULL,
	lease_expires_at = NULL,
	next_attempt_at = NULL,
	updated_at = now()
WHERE id = $1 AND lease_token = $2 AND queue_started_at IS NULL AND finished_at IS NULL
RETURNING ` + runColumns

// requeue is execute's guard for a run that never left its queue: only
// the queue starts it.
func (c *Client) requeue(ctx context.Context, run *Run) (*Run, error) {
	back, ok, err := queryRun(ctx, c.pool, requeueSQL, run.ID, run.LeaseToken)
	if err != nil {
		return nil, fmt.Errorf("engine: run %s: put back in its queue: %w", run.ID, err)
	}
	if !ok {
		return nil, fmt.Errorf("engine: run %s: %w", run.ID, ErrLeaseLost)
	}
	return back, nil
}

// waitsInQueue reports whether the run has not yet left its queue.
func (r *Run) waitsInQueue() bool {
	return r.Queue != nil && r.QueueStartedAt == nil
}

// QueueState is a queue as Why reports it for a run waiting in it.
type QueueState struct {
	// Concurrency, RateLimit and RatePeriod are the queue's limits as
	// this client declares them, or else as the processes that start its
	// runs last did; 0 for none.
	Concurrency int           `json:"concurrency,omitempty"`
	RateLimit   int           `json:"rate_limit,omitempty"`
	RatePeriod  time.Duration `json:"-"` // in Detail`
	// Executing counts its runs started and unfinished; Ahead the runs
	// that leave it before this one (higher priority, or as high and
	// older).
	Executing int `json:"executing"`
	Ahead     int `json:"ahead"`
	// LimitedUntil is when the rate limit lets the next run start, if it
	// holds the queue back now.
	LimitedUntil *time.Time `json:"limited_until,omitempty"`
}

const queueStateSQL = `
SELECT coalesce(q.concurrency, 0), coalesce(q.rate_limit, 0), coalesce(extract(epoch FROM q.rate_period), 0)::float8,
	CASE WHEN q.limited_until > now() THEN q.limited_until END,
	(SELECT count(*) FROM ratchet.runs WHERE queue = $1 AND queue_started_at IS NOT NULL AND finished_at IS NULL),
	(SELECT count(*) FROM ratchet.runs WHERE queue = $1 AND queue_started_at IS NULL AND finished_at IS NULL
		AND (priority > $2 OR (priority = $2 AND (created_at, id) < ($3, $4))))
FROM (SELECT 1) one LEFT JOIN ratchet.queues q ON q.name = $1`

// queueState reads what Why says of a run waiting in its queue.
func (c *Client) queueState(ctx context.Context, run *Run) (*QueueState, error) {
	var s QueueState
	var period float64
	if err := c.pool.QueryRow(ctx, queueStateSQL, *run.Queue, run.Priority, run.CreatedAt, run.ID).Scan(
		&s.Concurrency, &s.RateLimit, &period, &s.LimitedUntil, &s.Executing, &s.Ahead); err != nil {
		return nil, fmt.Errorf("engine: run %s: its queue: %w", run.ID, err)
	}
	s.RatePeriod = time.Duration(period * float64(time.Second))
	if q := c.queues[*run.Queue]; q != nil {
		s.Concurrency, s.RateLimit, s.RatePeriod = q.Concurrency, q.Rate.Limit, q.Rate.Period
	}
	return &s, nil
}
