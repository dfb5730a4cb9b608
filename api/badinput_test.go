package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/api"
	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/testdb"
)

// syncBuffer is a log destination for a server's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestBadBytesInIdsAndFiltersAreClientErrorsAndLogNothing(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	b := setup(t, &api.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})

	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/v1/runs/%00"},
		{http.MethodGet, "/v1/runs/%ff"},
		{http.MethodPost, "/v1/runs/%ff/cancel"},
		{http.MethodPost, "/v1/runs/%00/resume"},
		{http.MethodGet, "/v1/runs/01ARZ3NDEKTSV4RRFFQ69G5FA%c0"},
	} {
		requireProblem(t, b.do(t, c.method, c.path, ""), http.StatusNotFound, "run_not_found")
	}
	for _, q := range []string{"after=%00", "workflow=%c0%af", "idempotency_key=%ff", "child_key=a%00b", "status=%ff"} {
		requireProblem(t, b.do(t, http.MethodGet, "/v1/runs?"+q, ""), http.StatusBadRequest, "invalid_query")
	}
	require.NotContains(t, logs.String(), "level=ERROR")
}

func TestBodiesThatDecodersReadDifferentlyAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for i, body := range []string{
		"{\"value\": \"cus_\xfe\xff\"}",
		`{"value": "\udfff"}`,
		`{"value": "a", "value": "b"}`,
		`null`,
	} {
		requireProblem(t, b.start(t, "echo", fmt.Sprint("k", i), body), http.StatusBadRequest, "invalid_input")
	}
	var runs int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM ratchet.runs`).Scan(&runs))
	require.Zero(t, runs, "nothing was written")

	// The same key with two different invalid byte strings is not a replay:
	// neither is accepted at all.
	first := b.start(t, "echo", "same", "{\"value\": \"cus_\xff\xfe\"}")
	second := b.start(t, "echo", "same", "{\"value\": \"cus_\xfe\xff\"}")
	require.Equal(t, http.StatusBadRequest, first.status)
	require.Equal(t, http.StatusBadRequest, second.status)
	require.Empty(t, second.header.Get("Idempotent-Replayed"))
}

func TestRouterErrorsAreProblems(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	requireProblem(t, b.do(t, http.MethodGet, "/v1/nothing-here", ""), http.StatusNotFound, "not_found")
	r := b.do(t, http.MethodDelete, "/v1/runs/01ARZ3NDEKTSV4RRFFQ69G5FAV", "")
	requireProblem(t, r, http.StatusMethodNotAllowed, "method_not_allowed")
	require.Contains(t, r.header.Get("Allow"), http.MethodGet)
	// The mux's other answers are its own: a redirect to the cleaned path.
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1//runs", "").status)
}

func TestDatabaseFaultsAreUnavailableAndSayWhenToRetry(t *testing.T) {
	t.Parallel()
	pg := func(code string) error {
		return fmt.Errorf("engine: x: %w", &pgconn.PgError{Code: code, Severity: "FATAL"})
	}
	for code, status := range map[string]int{
		"57P01": http.StatusServiceUnavailable, // terminating connection due to administrator command
		"57P02": http.StatusServiceUnavailable, // crash shutdown
		"57P03": http.StatusServiceUnavailable, // the database system is starting up
		"08006": http.StatusServiceUnavailable, // connection failure
		"25006": http.StatusServiceUnavailable, // read-only transaction: a standby answered
		"40001": http.StatusConflict,
		"22021": http.StatusBadRequest, // invalid byte sequence
		"22P02": http.StatusBadRequest,
		"42P01": http.StatusInternalServerError, // a misconfiguration, the server's fault
	} {
		require.Equal(t, status, api.StatusOf(pg(code)), code)
		if status == http.StatusServiceUnavailable || status == http.StatusConflict {
			require.Equal(t, []string{"1"}, api.ProblemHeaders(pg(code))["Retry-After"], code)
		}
	}
	require.Equal(t, []string{"1"}, api.ProblemHeaders(engine.ErrShutdown)["Retry-After"], "shutting down")
	// The connection broke under a statement, as a switchover's shutdown
	// or a killed server leaves it.
	require.Equal(t, http.StatusServiceUnavailable, api.StatusOf(fmt.Errorf("engine: claim key: %w", io.ErrUnexpectedEOF)))
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	require.Equal(t, http.StatusServiceUnavailable, api.StatusOf(fmt.Errorf("engine: claim key: %w", reset)))
}

// The database ending the API's sessions (as a restart does: SQLSTATE
// 57P01) is a 503 with Retry-After, never a 500.
func TestSessionsEndedByTheDatabaseAreUnavailableNotInternal(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	created := b.start(t, "echo", "k", `{"value": "a"}`)
	require.Equal(t, http.StatusCreated, created.status, "%s", created)
	var run struct{ ID string }
	require.NoError(t, json.Unmarshal(created.body, &run))

	admin := testdb.Connect(t, testdb.AdminURL(), nil)
	var dbName string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&dbName))
	_, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, dbName)
	require.NoError(t, err)

	r := b.do(t, http.MethodGet, "/v1/runs/"+run.ID, "")
	requireProblem(t, r, http.StatusServiceUnavailable, "unavailable")
	require.Equal(t, "1", r.header.Get("Retry-After"))
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/runs/"+run.ID, "").status, "and the next request is served")
}
