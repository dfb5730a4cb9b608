package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/ratchet-run/ratchet/steps"
)

// Retentions of finished runs (WorkflowOpts.Retention): how long a run,
// and so its idempotency key, is kept once it finishes. Any other positive
// duration is valid too: a chargeback window of 120 days, say.
const (
	// Retention24h is the window HTTP clients are promised for retries.
	// The default.
	Retention24h = 24 * time.Hour
	// Retention7d suits consumers that replay messages.
	Retention7d = 7 * 24 * time.Hour
	// Retention30d is the window of Stripe's v2 idempotency keys.
	Retention30d = 30 * 24 * time.Hour
	// RetentionForever never expires a run: for ledgers and money.
	RetentionForever = time.Duration(math.MaxInt64)
)

// WorkflowOpts are options for Register. A nil *WorkflowOpts is valid.
type WorkflowOpts struct {
	// Version is recorded with every run, and a run is always executed by
	// the version it started with: register several versions of one name
	// side by side to change a workflow while runs of the old one are in
	// flight (docs/versioning.md). Defaults to 1.
	Version int
	// Drain registers the version only to finish the runs that started on
	// it: new runs (Client.Start, the API) start on the newest version
	// that does not drain. A typed Workflow's own Start still starts its
	// version.
	Drain bool
	// Retention is how long a finished run is kept: its expires_at is set
	// at finish, and the worker prunes it then (a key reused after that
	// is a new request). Defaults to Retention24h.
	Retention time.Duration
	// FailedRetention is how long a run that finishes failed or cancelled
	// is kept. Defaults to Retention; a money flow that keeps its
	// successes for ever may keep a refused input for a day.
	FailedRetention time.Duration
	// Retry says when a run that failed retryably is executed again, and
	// when it gives up. Defaults to the client's Config.Retry.
	Retry *RetryPolicy
	// SuccessStatus is the response status stored with a succeeded run, for
	// the HTTP layer to send and replay. Defaults to 201.
	SuccessStatus int
	// ErrorStatuses maps the codes of permanent errors to the response
	// status stored with a failed run, e.g. {"card_declined": 402}. Other
	// codes get 422.
	ErrorStatuses map[string]int
	// Concurrency limits how many runs of one key execute at once; runs
	// over the limit queue (see Concurrency). Nil: no limit.
	Concurrency *Concurrency
	// Queue names the queue the workflow's runs wait in before they start
	// (see Queue); it must be declared in the Config.Queues of the clients
	// that start them. Empty: none, the runs start at once.
	Queue string
}

// Default response statuses (see WorkflowOpts).
const (
	DefaultSuccessStatus = 201
	DefaultFailureStatus = 422
)

// Workflow is a registered workflow definition with input type In and
// output type Out. Start it with its Start or StartTx method.
type Workflow[In, Out any] struct {
	name          string
	ver           int
	drain         bool
	retention     time.Duration // of succeeded runs
	failRetention time.Duration // of failed and cancelled runs
	retry         *RetryPolicy  // nil: the client's
	successStatus int
	errorStatuses map[string]int
	conc          *Concurrency // nil: none
	queueName     string       // "": none
	fn            func(context.Context, In) (Out, error)
}

// definition is a workflow with its types erased, as the registry holds it.
type definition interface {
	Name() string
	version() int
	draining() bool
	// ttl is how long a run finishing as status is kept; nil for ever.
	ttl(status Status) *time.Duration
	// retryPolicy is the workflow's own retry policy, or nil.
	retryPolicy() *RetryPolicy
	// responseStatus is the status stored with a run finishing as status
	// with err.
	responseStatus(status Status, err *RunError) *int
	// concurrency is the workflow's concurrency declaration, or nil.
	concurrency() *Concurrency
	// queue is the queue the workflow's runs wait in, or "".
	queue() string
	// checkInput reports whether JSON input decodes into the input type.
	checkInput(input []byte) error
	// invoke decodes the input, runs the workflow and encodes its output.
	invoke(ctx context.Context, input []byte) ([]byte, error)
}

// Name returns the name the workflow was registered under.
func (w *Workflow[In, Out]) Name() string              { return w.name }
func (w *Workflow[In, Out]) version() int              { return w.ver }
func (w *Workflow[In, Out]) draining() bool            { return w.drain }
func (w *Workflow[In, Out]) retryPolicy() *RetryPolicy { return w.retry }
func (w *Workflow[In, Out]) concurrency() *Concurrency { return w.conc }
func (w *Workflow[In, Out]) queue() string             { return w.queueName }

func (w *Workflow[In, Out]) ttl(status Status) *time.Duration {
	d := w.retention
	if status != StatusSucceeded {
		d = w.failRetention
	}
	if d == RetentionForever {
		return nil
	}
	return &d
}

func (w *Workflow[In, Out]) responseStatus(status Status, err *RunError) *int {
	var s int
	switch {
	case status == StatusSucceeded:
		s = w.successStatus
	case status == StatusCompensated && (err == nil || err.Code == CodeCancelled):
		return nil // as a cancelled run's
	case (status == StatusFailed || status == StatusCompensated) && err != nil && w.errorStatuses[err.Code] != 0:
		s = w.errorStatuses[err.Code]
	case status == StatusFailed || status == StatusCompensated:
		s = DefaultFailureStatus
	default:
		return nil
	}
	return &s
}

func (w *Workflow[In, Out]) checkInput(input []byte) error {
	// JSON null decodes into a struct, a number or a string as if nothing
	// had been sent; only types with a nil of their own take it.
	if bytes.Equal(input, []byte("null")) {
		switch reflect.TypeFor[In]().Kind() {
		case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice:
		default:
			return fmt.Errorf("%w for workflow %q: the input is null", ErrInvalidInput, w.name)
		}
	}
	var in In
	if err := json.Unmarshal(input, &in); err != nil {
		return fmt.Errorf("%w for workflow %q: %v", ErrInvalidInput, w.name, err)
	}
	return nil
}

func (w *Workflow[In, Out]) invoke(ctx context.Context, input []byte) ([]byte, error) {
	var in In
	if err := json.Unmarshal(input, &in); err != nil {
		// Input was checked when the run was created; a failure here means
		// the input type changed incompatibly since.
		return nil, steps.Permanent("invalid_input", fmt.Errorf("decode stored input: %w", err))
	}
	out, err := w.fn(ctx, in)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, steps.Permanent("invalid_output", fmt.Errorf("encode output: %w", err))
	}
	return b, nil
}

// Register defines a workflow named name that runs fn, and adds it to the
// registry. Names are 1..255 characters of letters, digits, '.', '-' and
// '_'; a (name, version) pair is unique within the registry.
func Register[In, Out any](r *Workflows, name string, fn func(ctx context.Context, in In) (Out, error), opts *WorkflowOpts) (*Workflow[In, Out], error) {
	if opts == nil {
		opts = &WorkflowOpts{}
	}
	w := &Workflow[In, Out]{name: name, ver: opts.Version, drain: opts.Drain, retention: opts.Retention, failRetention: opts.FailedRetention, fn: fn,
		successStatus: opts.SuccessStatus, errorStatuses: make(map[string]int, len(opts.ErrorStatuses))}
	for code, status := range opts.ErrorStatuses {
		if status < 400 || status > 599 {
			return nil, fmt.Errorf("engine: workflow %q: status %d for error %q is not a 4xx or 5xx", name, status, code)
		}
		w.errorStatuses[code] = status
	}
	if w.successStatus == 0 {
		w.successStatus = DefaultSuccessStatus
	}
	if w.successStatus < 200 || w.successStatus > 299 {
		return nil, fmt.Errorf("engine: workflow %q: success status %d is not a 2xx", name, w.successStatus)
	}
	if w.ver == 0 {
		w.ver = 1
	}
	if w.retention == 0 {
		w.retention = Retention24h
	}
	if w.failRetention == 0 {
		w.failRetention = w.retention
	}
	if opts.Retry != nil {
		p := opts.Retry.withDefaults()
		if err := p.validate(); err != nil {
			return nil, fmt.Errorf("engine: workflow %q: %w", name, err)
		}
		w.retry = &p
	}
	if opts.Concurrency != nil {
		c := *opts.Concurrency
		if err := c.validate(); err != nil {
			return nil, fmt.Errorf("engine: workflow %q: %w", name, err)
		}
		w.conc = &c
	}
	if opts.Queue != "" && !validName(opts.Queue) {
		return nil, fmt.Errorf("engine: workflow %q: queue name %q: want 1..255 letters, digits, '.', '-' or '_'", name, opts.Queue)
	}
	w.queueName = opts.Queue
	switch {
	case !validName(name):
		return nil, fmt.Errorf("engine: workflow name %q: want 1..255 letters, digits, '.', '-' or '_'", name)
	case fn == nil:
		return nil, fmt.Errorf("engine: workflow %q: nil function", name)
	case w.ver < 0:
		return nil, fmt.Errorf("engine: workflow %q: negative version %d", name, w.ver)
	case w.retention < 0 || w.failRetention < 0:
		return nil, fmt.Errorf("engine: workflow %q: negative retention (RetentionForever keeps runs for ever)", name)
	}
	if err := r.add(w); err != nil {
		return nil, err
	}
	return w, nil
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 255 {
		return false
	}
	for _, r := range s {
		if !(r < utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r) || r == '.' || r == '-' || r == '_')) {
			return false
		}
	}
	return true
}

// Result is the outcome of starting a typed workflow.
type Result[Out any] struct {
	*StartResult
	// Output is the decoded output when the run has succeeded; the zero
	// value otherwise.
	Output Out
}

// StartOpts are the options of a start, one type for both ways in:
// Workflow.Start takes them (a nil *StartOpts is valid) and StartParams
// embeds them, so the typed start offers all that Client.Start does.
// StartTx ignores Wait.
type StartOpts struct {
	// Tenant scopes the idempotency key. Defaults to "default".
	Tenant string
	// Traceparent is the W3C trace context of the creating request.
	Traceparent string
	// Wait bounds how long Start waits for the inline execution of a run
	// it created. Zero waits until the execution concludes (or ctx ends); a
	// negative wait returns once the run is claimed. Either way the
	// execution is not cut short: it goes on in this client after Start
	// returns.
	Wait time.Duration
	// ConcurrencyKey is the value that keys the run's concurrency, in
	// place of the input field the workflow's Concurrency names (the
	// group is still the workflow's); ConcurrencyLimit, if not zero, the
	// limit in place of its. Either limits a workflow that declares no
	// Concurrency, by its name. Neither is part of the request's
	// fingerprint: a retry that names another key attaches to the run.
	ConcurrencyKey   string
	ConcurrencyLimit int
	// Queue, if set, is the queue the run waits in before it starts, in
	// place of the workflow's (WorkflowOpts.Queue); Priority its place
	// there, higher first (runs of one priority start in creation order).
	// A run in a queue executes nothing inline: Start returns it waiting.
	// Neither is part of the request's fingerprint.
	Queue    string
	Priority int
}

func (o *StartOpts) params(name, key string, input []byte) StartParams {
	p := StartParams{Workflow: name, IdempotencyKey: key, Input: input}
	if o != nil {
		p.StartOpts = *o
	}
	return p
}

// Start starts (or attaches to) the run for key with input in on client c,
// as Client.Start does, and decodes the output of a succeeded run. The
// execution is detached from ctx: calling Start with an HTTP request's
// context is safe, and a client that hangs up stops only the wait.
func (w *Workflow[In, Out]) Start(ctx context.Context, c *Client, key string, in In, opts *StartOpts) (*Result[Out], error) {
	input, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("%w: encode: %v", ErrInvalidInput, err)
	}
	res, err := c.start(ctx, nil, w, opts.params(w.name, key, input), true)
	return w.result(res, err)
}

// StartTx creates the run for key in the caller's transaction tx, as
// Client.StartTx does.
func (w *Workflow[In, Out]) StartTx(ctx context.Context, c *Client, tx pgx.Tx, key string, in In, opts *StartOpts) (*Result[Out], error) {
	input, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("%w: encode: %v", ErrInvalidInput, err)
	}
	res, err := c.start(ctx, tx, w, opts.params(w.name, key, input), false)
	return w.result(res, err)
}

// result types a StartResult. Like Client.Start, it may return a result
// together with an error that cut the inline execution short.
func (w *Workflow[In, Out]) result(res *StartResult, err error) (*Result[Out], error) {
	if res == nil {
		return nil, err
	}
	r := &Result[Out]{StartResult: res}
	if err == nil && res.Run.Status == StatusSucceeded {
		if err := json.Unmarshal(res.Run.Output, &r.Output); err != nil {
			return r, fmt.Errorf("engine: decode output of run %s: %w", res.Run.ID, err)
		}
	}
	return r, err
}
