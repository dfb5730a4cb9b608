package steps

import (
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// HeaderIdempotencyKey is the header the transport sets.
const HeaderIdempotencyKey = "Idempotency-Key"

// TransportOpts configure NewTransport. A nil *TransportOpts is valid.
type TransportOpts struct {
	// Base sends the requests. Defaults to http.DefaultTransport.
	Base http.RoundTripper
	// TracerProvider makes the client span of each request. Defaults to
	// OpenTelemetry's global provider.
	TracerProvider trace.TracerProvider
	// Propagator writes the trace context into the request. Defaults to
	// W3C Trace Context and Baggage, whatever the global propagator is:
	// a step always sends traceparent when its context carries a span.
	Propagator propagation.TextMapPropagator
}

// NewTransport returns a RoundTripper for a step's outgoing requests:
//
//   - it sets Idempotency-Key to the key in the request's context (see
//     WithKey; engine.Step puts the child key there), unless the request
//     already has one;
//   - it makes a client span and sends the trace context (traceparent);
//   - it wraps a failure that came after the request was written in an
//     IndeterminateError, so a retry policy treats it as "may have
//     happened".
func NewTransport(opts *TransportOpts) http.RoundTripper {
	if opts == nil {
		opts = &TransportOpts{}
	}
	base := opts.Base
	if base == nil {
		base = http.DefaultTransport
	}
	prop := opts.Propagator
	if prop == nil {
		prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	otelOpts := []otelhttp.Option{otelhttp.WithPropagators(prop)}
	if opts.TracerProvider != nil {
		otelOpts = append(otelOpts, otelhttp.WithTracerProvider(opts.TracerProvider))
	}
	return &transport{next: otelhttp.NewTransport(base, otelOpts...)}
}

// NewClient returns an http.Client using NewTransport(opts).
func NewClient(opts *TransportOpts) *http.Client {
	return &http.Client{Transport: NewTransport(opts)}
}

type transport struct{ next http.RoundTripper }

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if key, ok := KeyFrom(req.Context()); ok && req.Header.Get(HeaderIdempotencyKey) == "" {
		req = req.Clone(req.Context())
		req.Header.Set(HeaderIdempotencyKey, string(key))
	}
	var wrote atomic.Bool
	watch := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Store(true) }}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), watch))
	resp, err := t.next.RoundTrip(req)
	if err != nil && wrote.Load() {
		return nil, &IndeterminateError{Err: err}
	}
	return resp, err
}

// CheckResponse returns nil for a 2xx response. Otherwise it reads up to
// 4 KiB of the body, closes it, and returns a *StatusError carrying the
// status and the Retry-After header.
func CheckResponse(resp *http.Response) error {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	return &StatusError{
		StatusCode: resp.StatusCode,
		RetryAfter: ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now()),
		Body:       body,
	}
}

// ParseRetryAfter reads a Retry-After value, either delay-seconds or an
// HTTP date (RFC 9110 §10.2.3), as a wait from now. It returns 0 for an
// absent, malformed or past value.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		return time.Duration(min(secs, int64(24*time.Hour/time.Second))) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil && at.After(now) {
		return at.Sub(now)
	}
	return 0
}
