package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratchet-run/ratchet/engine"
)

// Defaults for Config.
const (
	DefaultWait         = 10 * time.Second
	DefaultMaxWait      = 60 * time.Second
	DefaultMaxBodyBytes = 1 << 20
)

// Config configures a Handler. The zero value of every field but Engine
// selects its documented default.
type Config struct {
	// Engine executes and stores runs. Required. Use a worker's engine
	// (worker.Worker.Engine) so that runs the request does not finish are
	// resumed in the background.
	Engine *engine.Client

	// Tokens maps bearer tokens to tenants. Empty means development mode:
	// no authentication, every request is tenant "default".
	Tokens map[string]string

	// DefaultWait bounds how long a start request executes inline without
	// a "Prefer: wait=N" header. Defaults to 10s.
	DefaultWait time.Duration
	// MaxWait caps the wait a client may ask for. Defaults to 60s. The
	// server's WriteTimeout must exceed it (see NewServer).
	MaxWait time.Duration
	// MaxBodyBytes bounds a start request's body. Defaults to 1 MiB.
	MaxBodyBytes int64

	// PathPrefix mounts the API under a path, such as "/ratchet": every
	// route, and every Location the API sends, begins with it. Serve the
	// handler as is, without http.StripPrefix:
	// mux.Handle("/ratchet/", h). Empty serves it at the root. A handler
	// mounted with http.StripPrefix says so: with a PathPrefix, in the
	// 404 every route then answers; without, in a warning logged once
	// (its Locations lack the prefix).
	PathPrefix string

	// Ready reports whether the service can take requests (GET /readyz).
	// Defaults to: the database answers and its migrations are current.
	Ready func(context.Context) error

	// TracerProvider makes request spans, continuing an incoming
	// traceparent. Defaults to OpenTelemetry's global provider.
	TracerProvider trace.TracerProvider
	// MeterProvider makes the API's metrics. Defaults to OpenTelemetry's
	// global provider.
	MeterProvider metric.MeterProvider

	// Logger receives request errors. Defaults to discarding.
	Logger *slog.Logger
}

// Handler serves the API.
type Handler struct {
	cfg       Config
	engine    *engine.Client
	mux       *http.ServeMux
	root      http.Handler // mux, traced and counted
	tokens    []tokenHash
	logger    *slog.Logger
	stripWarn sync.Once
	responses metric.Int64Counter

	drainOnce sync.Once
	draining  chan struct{} // closed by Drain
}

type tokenHash struct {
	sum    [32]byte
	tenant string
}

// withDefaults returns a copy of c with every unset field at its default,
// or why it cannot work.
func (c *Config) withDefaults() (*Config, error) {
	out := *c
	if out.DefaultWait == 0 {
		out.DefaultWait = DefaultWait
	}
	if out.MaxWait == 0 {
		out.MaxWait = DefaultMaxWait
	}
	if out.MaxBodyBytes == 0 {
		out.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if out.Ready == nil {
		out.Ready = out.Engine.Ping
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return &out, out.validate()
}

func (c *Config) validate() error {
	switch {
	case c.DefaultWait < 0 || c.MaxWait < 0 || c.DefaultWait > c.MaxWait:
		return fmt.Errorf("api: want 0 <= DefaultWait (%s) <= MaxWait (%s)", c.DefaultWait, c.MaxWait)
	case c.MaxBodyBytes < 0:
		return errors.New("api: negative MaxBodyBytes")
	case c.PathPrefix != "" && (!strings.HasPrefix(c.PathPrefix, "/") || strings.HasSuffix(c.PathPrefix, "/") || strings.ContainsAny(c.PathPrefix, "{}? \t")):
		return fmt.Errorf("api: PathPrefix %q: want a path like /ratchet, without a trailing slash, braces or spaces", c.PathPrefix)
	}
	for token, tenant := range c.Tokens {
		if token == "" || tenant == "" {
			return errors.New("api: empty token or tenant in Config.Tokens")
		}
	}
	return nil
}

// New returns the API handler.
func New(cfg *Config) (*Handler, error) {
	if cfg == nil || cfg.Engine == nil {
		return nil, errors.New("api: Config.Engine is required")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: *c, engine: c.Engine, draining: make(chan struct{})}
	c = &h.cfg
	h.logger = c.Logger
	for token, tenant := range c.Tokens {
		h.tokens = append(h.tokens, tokenHash{sum: sha256.Sum256([]byte(token)), tenant: tenant})
	}

	h.mux = http.NewServeMux()
	prefix := c.PathPrefix
	route := func(pattern string, handler http.Handler) {
		method, path, _ := strings.Cut(pattern, " ")
		pattern = method + " " + prefix + path
		h.mux.Handle(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			trace.SpanFromContext(r.Context()).SetName(r.Pattern) // low-cardinality span names
			handler.ServeHTTP(w, r)
		}))
	}
	route("GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}))
	route("GET /readyz", http.HandlerFunc(h.ready))
	route("POST /v1/workflows/{workflow}/runs", h.authed(h.startRun))
	route("GET /v1/runs/{id}", h.authed(h.getRun))
	route("GET /v1/runs", h.authed(h.listRuns))
	route("POST /v1/runs/{id}/cancel", h.authed(h.cancelRun))
	route("POST /v1/runs/{id}/resume", h.authed(h.resumeRun))
	route("POST /v1/runs/{id}/signals/{name}", h.authed(h.signalRun))
	route("POST /v1/signals/{name}", h.authed(h.signalByKey))
	route("GET /v1/schedules", h.authed(h.listSchedules))
	route("GET /v1/schedules/{name}", h.authed(h.getSchedule))
	route("PUT /v1/schedules/{name}", h.authed(h.putSchedule))
	route("DELETE /v1/schedules/{name}", h.authed(h.deleteSchedule))
	route("POST /v1/schedules/{name}/pause", h.authed(h.pauseSchedule(true)))
	route("POST /v1/schedules/{name}/resume", h.authed(h.pauseSchedule(false)))
	route("POST /v1/schedules/{name}/trigger", h.authed(h.triggerSchedule))
	route("GET /ui/", uiHandler(prefix))
	route("GET /ui", http.RedirectHandler(prefix+"/ui/", http.StatusMovedPermanently))

	mp := c.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	h.responses, err = mp.Meter(instrumentation).Int64Counter("ratchet.api.responses",
		metric.WithDescription("API responses by status (409: in progress or conflict; 422: key reused)."), metric.WithUnit("{response}"))
	if err != nil {
		return nil, fmt.Errorf("api: metrics: %w", err)
	}
	otelOpts := []otelhttp.Option{
		otelhttp.WithPropagators(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})),
		otelhttp.WithMeterProvider(mp),
	}
	if c.TracerProvider != nil {
		otelOpts = append(otelOpts, otelhttp.WithTracerProvider(c.TracerProvider))
	}
	h.root = otelhttp.NewHandler(http.HandlerFunc(h.count), "ratchet.api", otelOpts...)
	return h, nil
}

const instrumentation = "github.com/ratchet-run/ratchet/api"

// count serves a request and counts its response's status.
func (h *Handler) count(w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	stripped := strippedPrefix(r)
	if stripped != "" && h.cfg.PathPrefix == "" {
		h.stripWarn.Do(func() {
			h.logger.WarnContext(r.Context(), "api: mounted with http.StripPrefix: the links it sends (Location, the page's) lack "+stripped+
				"; serve the handler as is, mux.Handle(\""+stripped+"/\", h), with api.Config.PathPrefix \""+stripped+"\"",
				slog.String("prefix", stripped))
		})
	}
	if _, pattern := h.mux.Handler(r); pattern == "" {
		if h.cfg.PathPrefix == "" {
			stripped = "" // its routes matched nothing for another reason
		}
		unrouted(h.mux, sw, r, stripped)
	} else {
		h.mux.ServeHTTP(sw, r)
	}
	h.responses.Add(r.Context(), 1, metric.WithAttributes(attribute.Int("http.response.status_code", sw.status)))
}

// strippedPrefix is what a mount took off the request's path before the
// handler saw it (http.StripPrefix changes URL.Path, not RequestURI), or
// "".
func strippedPrefix(r *http.Request) string {
	if r.RequestURI == "" || r.RequestURI == "*" {
		return ""
	}
	u, err := url.ParseRequestURI(r.RequestURI)
	if err != nil {
		return ""
	}
	full, seen := u.EscapedPath(), r.URL.EscapedPath()
	if len(full) <= len(seen) || !strings.HasSuffix(full, seen) {
		return ""
	}
	return strings.TrimSuffix(full[:len(full)-len(seen)], "/")
}

// unrouted answers a request that matches no route as the mux would (404,
// or 405 with Allow), but as a problem like every other error, not the
// mux's text/plain.
func unrouted(mux *http.ServeMux, w http.ResponseWriter, r *http.Request, stripped string) {
	answer := &capture{header: http.Header{}}
	mux.ServeHTTP(answer, r)
	if answer.status != http.StatusNotFound && answer.status != http.StatusMethodNotAllowed {
		mux.ServeHTTP(w, r) // a redirect to the cleaned path, say: the mux's own answer, without side effects
		return
	}
	if allow := answer.header.Get("Allow"); allow != "" {
		w.Header().Set("Allow", allow)
	}
	p := problem{Status: answer.status, Code: "not_found", Title: "No such resource"}
	if stripped != "" {
		// Every route begins with Config.PathPrefix, which the mount
		// took off.
		p.Detail = fmt.Sprintf("the API is mounted with http.StripPrefix(%q, ...), which takes off the PathPrefix its routes begin with: "+
			"serve the handler as is, mux.Handle(%q, h)", stripped, stripped+"/")
	}
	if answer.status == http.StatusMethodNotAllowed {
		p.Code, p.Title, p.Detail = "method_not_allowed", "Method not allowed", "allowed: "+answer.header.Get("Allow")
	}
	writeProblem(w, p)
}

// capture keeps the status and headers of a response and drops its body.
type capture struct {
	header http.Header
	status int
}

func (c *capture) Header() http.Header { return c.header }

func (c *capture) WriteHeader(status int) { c.status = status }

func (c *capture) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	return len(b), nil
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			h.logger.ErrorContext(r.Context(), "api: handler panicked", slog.Any("panic", v), slog.String("path", r.URL.Path))
			writeProblem(w, problem{Status: http.StatusInternalServerError, Code: codeInternal, Title: "Internal error"})
		}
	}()
	h.root.ServeHTTP(w, r)
}

// authed resolves the request's tenant from its bearer token (compared in
// constant time, never logged) before calling next.
func (h *Handler) authed(next func(http.ResponseWriter, *http.Request, string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(h.tokens) == 0 {
			next(w, r, engine.DefaultTenant)
			return
		}
		tenant := ""
		if scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
			sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
			for _, t := range h.tokens { // no early exit: the time taken says nothing of which token matched
				if subtle.ConstantTimeCompare(sum[:], t.sum[:]) == 1 {
					tenant = t.tenant
				}
			}
		}
		if tenant == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ratchet"`)
			writeProblem(w, problem{Status: http.StatusUnauthorized, Code: codeUnauthorized, Title: "A valid bearer token is required"})
			return
		}
		next(w, r, tenant)
	})
}

func (h *Handler) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := h.cfg.Ready(ctx); err != nil {
		h.logger.WarnContext(ctx, "api: not ready", slog.String("error", err.Error()))
		writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: codeUnavailable, Title: "Not ready"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// fail logs err when it is the server's fault and answers with its problem.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	p := problemFor(err)
	if p.Status >= 500 {
		h.logger.ErrorContext(r.Context(), "api: request failed", slog.String("path", r.URL.Path), slog.String("error", err.Error()))
	}
	writeProblem(w, p)
}

func (h *Handler) startRun(w http.ResponseWriter, r *http.Request, tenant string) {
	workflow := r.PathValue("workflow")
	if !h.engine.Workflows().Has(workflow) {
		writeProblem(w, problem{Status: http.StatusNotFound, Code: "unknown_workflow", Title: "No such workflow", Detail: fmt.Sprintf("no workflow is registered as %q", workflow)})
		return
	}
	key, err := parseIdempotencyKey(r.Header.Values("Idempotency-Key"))
	if err != nil {
		code := codeInvalidKey
		if errors.Is(err, errMissingKey) {
			code = codeMissingKey
		}
		writeProblem(w, problem{Status: http.StatusBadRequest, Code: code, Title: "Idempotency-Key missing or invalid", Detail: err.Error()})
		return
	}
	body, ok := h.readJSON(w, r)
	if !ok {
		return
	}
	concKey, concLimit, err := concurrencyHeaders(r.Header)
	if err != nil {
		writeProblem(w, problem{Status: http.StatusBadRequest, Code: "invalid_concurrency", Title: "Ratchet-Concurrency-Key or -Limit invalid", Detail: err.Error()})
		return
	}
	queue, priority, err := queueHeaders(r.Header)
	if err != nil {
		writeProblem(w, problem{Status: http.StatusBadRequest, Code: "invalid_queue", Title: "Ratchet-Queue or -Priority invalid", Detail: err.Error()})
		return
	}
	wait := h.cfg.DefaultWait
	if d, ok := preferredWait(r.Header.Values("Prefer")); ok {
		wait = min(d, h.cfg.MaxWait)
		w.Header().Set("Preference-Applied", "wait="+strconv.Itoa(int(wait/time.Second)))
	}

	// Start waits at most wait, and no longer than the client or a drain
	// allows; the execution itself is detached from the request and goes
	// on in the engine whichever stops the wait.
	ctx, stop := context.WithCancel(r.Context())
	defer stop()
	go func() {
		select {
		case <-h.draining:
			stop()
		case <-ctx.Done():
		}
	}()
	if wait == 0 {
		wait = -1 // answer once the run is claimed
	}
	res, err := h.engine.Start(ctx, engine.StartParams{
		// The run's traceparent is the request span's (the engine reads it
		// from the context), so resumed executions link to this request.
		Workflow: workflow, IdempotencyKey: key, Input: body,
		StartOpts: engine.StartOpts{Tenant: tenant, Wait: wait, ConcurrencyKey: concKey, ConcurrencyLimit: concLimit, Queue: queue, Priority: priority},
	})
	if res == nil {
		h.fail(w, r, err)
		return
	}
	run := res.Run
	switch res.Outcome {
	case engine.OutcomeFinished:
		h.writeFinal(w, run, true)
	case engine.OutcomeInProgress:
		w.Header().Set("Retry-After", retryAfter(run))
		writeProblem(w, problem{Status: http.StatusConflict, Code: codeInProgress, Title: "A request with this Idempotency-Key is in progress",
			RunID: run.ID, Instance: h.runPath(run.ID)})
	case engine.OutcomeResumable:
		// Not a run backing off, nor one parked with nothing to wake it
		// (a signal not yet sent, an operator's decision): due_at is NULL.
		if run.DueAt != nil && !run.DueAt.After(time.Now()) {
			h.takeOver(r, run.ID)
		}
		h.writeAccepted(w, run)
	case engine.OutcomeCreated:
		if r.Context().Err() != nil {
			return // the client is gone; the run goes on
		}
		if err != nil && !run.Status.Finished() && !errors.Is(err, context.Canceled) && !errors.Is(err, engine.ErrShutdown) && !errors.Is(err, engine.ErrLeaseLost) {
			h.logger.WarnContext(r.Context(), "api: inline execution cut short", slog.String("run_id", run.ID), slog.String("error", err.Error()))
		}
		if run.Status.Finished() {
			h.writeFinal(w, run, false)
			return
		}
		h.writeAccepted(w, run)
	}
}

// readJSON reads a request's JSON body, or answers why it cannot.
func (h *Handler) readJSON(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if !isJSON(r.Header.Get("Content-Type")) {
		writeProblem(w, problem{Status: http.StatusUnsupportedMediaType, Code: codeUnsupportedMedia, Title: "Send the body as application/json"})
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeProblem(w, problem{Status: http.StatusRequestEntityTooLarge, Code: codeBodyTooLarge, Title: "Request body too large", Detail: fmt.Sprintf("the limit is %d bytes", tooLarge.Limit)})
		return nil, false
	case err != nil:
		writeProblem(w, problem{Status: http.StatusBadRequest, Code: codeMalformedJSON, Title: "Could not read the request body"})
		return nil, false
	case !json.Valid(body):
		writeProblem(w, problem{Status: http.StatusBadRequest, Code: codeMalformedJSON, Title: "The body is not valid JSON"})
		return nil, false
	}
	return body, true
}

// Drain makes every start request that waits for its inline execution, and
// every later one, answer 202 with the run's Location at once: the first
// step of a graceful shutdown, before http.Server.Shutdown (which waits for
// handlers) and the engine's (which hands the executions over). The
// executions themselves go on until the engine stops them.
func (h *Handler) Drain() {
	h.drainOnce.Do(func() { close(h.draining) })
}

// takeOver continues a run at once, on a context that outlives the
// request (the engine's Shutdown hands the run over if need be). A run
// someone else takes first is theirs; any other error is logged (the
// run's state is the record, and a worker finds it due).
func (h *Handler) takeOver(r *http.Request, runID string) {
	ctx := context.WithoutCancel(r.Context())
	go func() {
		_, err := h.engine.TakeOver(ctx, runID)
		var held *engine.LeaseHeldError
		if err != nil && !errors.As(err, &held) && !errors.Is(err, engine.ErrShutdown) {
			h.logger.WarnContext(ctx, "api: continuing the run failed; a worker continues it when it is due",
				slog.String("run_id", runID), slog.String("error", err.Error()))
		}
	}()
}

func (h *Handler) writeFinal(w http.ResponseWriter, run *engine.Run, replayed bool) {
	status, contentType, body := finalResponse(run, h.runPath(run.ID))
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Location", h.runPath(run.ID))
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // the client may be gone
}

func (h *Handler) writeAccepted(w http.ResponseWriter, run *engine.Run) {
	w.Header().Set("Location", h.runPath(run.ID))
	w.Header().Set("Retry-After", "1")
	writeJSON(w, http.StatusAccepted, newRunResource(run, nil))
}

// retryAfter is the whole seconds until the run's lease expires, at least 1.
func retryAfter(run *engine.Run) string {
	secs := 1.0
	if run.LeaseExpiresAt != nil {
		secs = max(math.Ceil(time.Until(*run.LeaseExpiresAt).Seconds()), 1)
	}
	return strconv.Itoa(int(secs))
}

// runPath is the path of a run's resource.
func (h *Handler) runPath(id string) string { return h.cfg.PathPrefix + "/v1/runs/" + id }

// tenantRun loads a run of tenant; another tenant's run is not found.
func (h *Handler) tenantRun(ctx context.Context, id, tenant string) (*engine.Run, error) {
	run, err := h.engine.GetRun(ctx, id)
	if err != nil {
		return nil, err
	}
	if run.Tenant != tenant {
		return nil, fmt.Errorf("%w: %s", engine.ErrRunNotFound, id)
	}
	return run, nil
}

func (h *Handler) getRun(w http.ResponseWriter, r *http.Request, tenant string) {
	run, err := h.tenantRun(r.Context(), r.PathValue("id"), tenant)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if !run.Status.Finished() {
		if run, err = h.engine.Why(r.Context(), run.ID); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	phases, err := h.engine.Phases(r.Context(), run.ID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	res := newRunResource(run, phases)
	res.Input = run.Input // the run's page shows it; a start's answer does not
	if slices.ContainsFunc(phases, func(p engine.Phase) bool { return p.Kind == engine.KindStartChild }) {
		children, err := h.engine.Children(r.Context(), run.ID)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		for _, c := range children {
			res.Children = append(res.Children, childResource{ID: c.ID, Workflow: c.Workflow, Status: c.Status})
		}
	}
	writeJSON(w, http.StatusOK, res)
}

func (h *Handler) listRuns(w http.ResponseWriter, r *http.Request, tenant string) {
	q := r.URL.Query()
	p := engine.ListParams{
		Tenant: tenant, Workflow: q.Get("workflow"), Status: engine.Status(q.Get("status")),
		IdempotencyKey: q.Get("idempotency_key"), ChildKey: q.Get("child_key"), After: q.Get("after"),
	}
	bad := func(detail string) {
		writeProblem(w, problem{Status: http.StatusBadRequest, Code: codeInvalidQuery, Title: "Invalid query", Detail: detail})
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 500 {
			bad("limit must be an integer from 1 to 500")
			return
		}
		p.Limit = n
	}
	p.Blocked = engine.BlockedReason(q.Get("blocked")) // the engine refuses an unknown one, or status (400)
	runs, err := h.engine.ListRuns(r.Context(), p)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	page := struct {
		Data []runResource `json:"data"`
		Next *string       `json:"next"`
	}{Data: make([]runResource, 0, len(runs))}
	for i := range runs {
		page.Data = append(page.Data, newRunResource(&runs[i], nil))
	}
	limit := p.Limit
	if limit == 0 {
		limit = 50
	}
	if len(runs) == limit {
		page.Next = &runs[len(runs)-1].ID
	}
	writeJSON(w, http.StatusOK, page)
}

func (h *Handler) cancelRun(w http.ResponseWriter, r *http.Request, tenant string) {
	run, err := h.tenantRun(r.Context(), r.PathValue("id"), tenant)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	res, err := h.engine.Cancel(r.Context(), run.ID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	status := http.StatusOK // cancelled
	if res.Outcome != engine.CancelledNow {
		status = http.StatusAccepted // compensates, or the executor stops at its next phase boundary
	}
	writeJSON(w, status, cancelResource{runResource: newRunResource(res.Run, nil), Cancellation: res.Outcome})
}

// cancelResource is a cancel's answer: the run, and what the cancellation
// does — "cancelled" (done), "compensates" (an executor undoes the run's
// compensable phases) or "requested" (the executor holding it stops at its
// next phase boundary, compensating what has an undo by then).
type cancelResource struct {
	runResource
	Cancellation engine.CancelOutcome `json:"cancellation"`
}

func (h *Handler) resumeRun(w http.ResponseWriter, r *http.Request, tenant string) {
	run, err := h.tenantRun(r.Context(), r.PathValue("id"), tenant)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if run, err = h.engine.Reopen(r.Context(), run.ID); err != nil {
		h.fail(w, r, err)
		return
	}
	h.takeOver(r, run.ID)
	h.writeAccepted(w, run)
}
