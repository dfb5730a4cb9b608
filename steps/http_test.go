package steps_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ratchet-run/ratchet/steps"
)

func TestTransportSendsKeyAndTraceparent(t *testing.T) {
	t.Parallel()
	got := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
	}))
	defer srv.Close()

	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background()) //nolint:errcheck
	ctx, span := tp.Tracer("test").Start(context.Background(), "step")
	defer span.End()
	key := steps.ChildKey("default", "run-1", "charge")
	ctx = steps.WithKey(ctx, key)

	client := steps.NewClient(&steps.TransportOpts{TracerProvider: tp})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{}`))
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	require.NoError(t, steps.CheckResponse(resp))
	resp.Body.Close()

	h := <-got
	require.Equal(t, string(key), h.Get("Idempotency-Key"))
	traceparent := h.Get("Traceparent")
	require.NotEmpty(t, traceparent)
	require.Equal(t, span.SpanContext().TraceID().String(), strings.Split(traceparent, "-")[1], "the request continues the step's trace")
}

func TestTransportKeepsAnExplicitKey(t *testing.T) {
	t.Parallel()
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Idempotency-Key")
	}))
	defer srv.Close()
	ctx := steps.WithKey(context.Background(), "rk1_fromcontext")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "explicit")
	resp, err := steps.NewClient(nil).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, "explicit", <-got)
}

func TestTransportMarksFailuresAfterSendingIndeterminate(t *testing.T) {
	t.Parallel()
	// The server reads the request and drops the connection unanswered.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	defer srv.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":1}`))
	require.NoError(t, err)
	_, err = steps.NewClient(nil).Do(req)
	require.Error(t, err)
	require.Equal(t, steps.ClassIndeterminate, steps.Classify(err), "%v", err)
}

func TestTransportMarksUnsentFailuresRetryable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close() // nothing listens: the request is never written

	req, err := http.NewRequest(http.MethodPost, "http://"+addr, nil)
	require.NoError(t, err)
	_, err = steps.NewClient(nil).Do(req)
	require.Error(t, err)
	require.Equal(t, steps.ClassRetryable, steps.Classify(err), "%v", err)
}

func TestCheckResponseCarriesStatusAndRetryAfter(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "3")
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write([]byte(`{"error":"slow down"}`)) //nolint:errcheck
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	err = steps.CheckResponse(resp)
	var status *steps.StatusError
	require.ErrorAs(t, err, &status)
	require.Equal(t, http.StatusTooManyRequests, status.StatusCode)
	require.Equal(t, 3*time.Second, status.RetryAfter)
	require.JSONEq(t, `{"error":"slow down"}`, string(status.Body))
	require.Equal(t, steps.ClassRetryable, steps.Classify(err))
}
