package api_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/api"
)

// Mounted under a prefix in the application's own mux, the API routes and
// links under it: a Location followed as given finds the run.
func TestAPIUnderAPathPrefix(t *testing.T) {
	t.Parallel()
	b := setup(t, &api.Config{PathPrefix: "/ratchet"})
	mux := http.NewServeMux()
	mux.Handle("/ratchet/", b.handler)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	app := httptest.NewServer(mux)
	t.Cleanup(app.Close)
	b.server.URL = app.URL // b.do now goes through the application's mux

	r := b.do(t, http.MethodPost, "/ratchet/v1/workflows/echo/runs", `{"value":"p"}`, "Content-Type", "application/json", "Idempotency-Key", "k")
	require.Equal(t, http.StatusCreated, r.status, "%s", r)
	loc := r.header.Get("Location")
	require.True(t, strings.HasPrefix(loc, "/ratchet/v1/runs/"), loc)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, loc, "").status)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/ratchet/healthz", "").status)
	require.Equal(t, http.StatusTeapot, b.do(t, http.MethodGet, "/v1/runs", "").status, "nothing is served outside the prefix")

	slow := b.do(t, http.MethodPost, "/ratchet/v1/workflows/slow/runs", `{"value":"s"}`, "Content-Type", "application/json", "Idempotency-Key", "s", "Prefer", "wait=0")
	require.Equal(t, http.StatusAccepted, slow.status)
	require.True(t, strings.HasPrefix(slow.header.Get("Location"), "/ratchet/v1/runs/"))
	conflict := b.do(t, http.MethodPost, "/ratchet/v1/workflows/slow/runs", `{"value":"s"}`, "Content-Type", "application/json", "Idempotency-Key", "s")
	require.Equal(t, http.StatusConflict, conflict.status)
	require.Contains(t, string(conflict.body), `"instance":"/ratchet/v1/runs/`)
}

func TestPathPrefixIsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, bad := range []string{"ratchet", "/ratchet/", "/{x}", "/a b"} {
		_, err := api.New(&api.Config{Engine: b.engine, PathPrefix: bad})
		require.ErrorContains(t, err, "PathPrefix", bad)
	}
}

// lockedBuffer is a log sink the handler writes to from its goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Mounted with http.StripPrefix, which the API does not support, it says
// so: with a PathPrefix every route would be a bare 404, and the 404 says
// how to mount it; without one its Locations lack the prefix, and it logs
// that once.
func TestAMountWithStripPrefixIsExplained(t *testing.T) {
	t.Parallel()
	serve := func(t *testing.T, cfg *api.Config) *testBundle {
		b := setup(t, cfg)
		mux := http.NewServeMux()
		mux.Handle("/ratchet/", http.StripPrefix("/ratchet", b.handler))
		app := httptest.NewServer(mux)
		t.Cleanup(app.Close)
		b.server.URL = app.URL
		return b
	}

	b := serve(t, &api.Config{PathPrefix: "/ratchet"})
	r := b.do(t, http.MethodGet, "/ratchet/healthz", "")
	require.Equal(t, http.StatusNotFound, r.status)
	require.Contains(t, string(r.body), `http.StripPrefix(\"/ratchet\", ...)`, "%s", r)
	require.Contains(t, string(r.body), `mux.Handle(\"/ratchet/\", h)`)

	logs := &lockedBuffer{}
	b = serve(t, &api.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	for range 2 {
		require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/ratchet/healthz", "").status)
	}
	require.Equal(t, 1, strings.Count(logs.String(), "mounted with http.StripPrefix"), logs.String())
	require.Contains(t, logs.String(), "prefix=/ratchet")

	// Mounted as documented, nothing is said.
	logs = &lockedBuffer{}
	b = setup(t, &api.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/healthz", "").status)
	require.NotContains(t, logs.String(), "StripPrefix")
}
