package api_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
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
