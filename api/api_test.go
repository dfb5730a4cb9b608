package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/api"
	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
)

func decode[T any](t *testing.T, r response) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal(r.body, &v), "%s", r)
	return v
}

type runJSON struct {
	ID     string          `json:"id"`
	Status string          `json:"status"`
	Output json.RawMessage `json:"output"`
	Phases []struct {
		Name     string  `json:"name"`
		ChildKey *string `json:"child_key"`
	} `json:"phases"`
}

type problemJSON struct {
	Type   string `json:"type"`
	Status int    `json:"status"`
	Code   string `json:"code"`
	RunID  string `json:"run_id"`
	Detail string `json:"detail"`
}

func requireProblem(t *testing.T, r response, status int, code string) problemJSON {
	t.Helper()
	require.Equal(t, status, r.status, "%s", r)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	p := decode[problemJSON](t, r)
	require.Equal(t, code, p.Code)
	require.Equal(t, status, p.Status)
	require.Equal(t, "urn:ratchet:problem:"+code, p.Type)
	return p
}

func TestStartCreatesRunWithTheWorkflowStatus(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.start(t, "echo", "k1", `{"value":"a"}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r)
	run := decode[runJSON](t, r)
	require.Equal(t, "succeeded", run.Status)
	require.JSONEq(t, `{"value":"a"}`, string(run.Output))
	require.Equal(t, "/v1/runs/"+run.ID, r.header.Get("Location"))
	require.Empty(t, r.header.Get("Idempotent-Replayed"))
}

func TestReplayIsByteIdenticalAndMarked(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := b.start(t, "echo", "k1", `{"value":"a"}`)
	// Same input, other key order and spacing: the same request.
	again := b.start(t, "echo", "k1", ` { "value" : "a" } `)
	require.Equal(t, first.status, again.status)
	require.Equal(t, first.body, again.body, "byte for byte")
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.counter(t, "a"))

	// A structured-string key is the same key as its bare form.
	sf := b.start(t, "echo", `"k1"`, `{"value":"a"}`)
	require.Equal(t, first.body, sf.body)
}

func TestFailedRunReplaysItsMappedStatus(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := b.start(t, "pay", "p1", `{"customer":"cus_declined","amount":5}`)
	p := requireProblem(t, first, http.StatusPaymentRequired, "card_declined")
	require.NotEmpty(t, p.RunID)
	again := b.start(t, "pay", "p1", `{"customer":"cus_declined","amount":5}`)
	require.Equal(t, first.body, again.body)
	require.Equal(t, http.StatusPaymentRequired, again.status)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
}

func TestNotFinishedWithinWaitIsAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.start(t, "slow", "s1", `{"value":"x"}`, "Prefer", "wait=0")
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	require.Equal(t, "wait=0", r.header.Get("Preference-Applied"))
	run := decode[runJSON](t, r)
	require.Equal(t, "/v1/runs/"+run.ID, r.header.Get("Location"))

	// A live executor holds it: a retry is told to come back.
	busy := b.start(t, "slow", "s1", `{"value":"x"}`)
	p := requireProblem(t, busy, http.StatusConflict, "run_in_progress")
	require.Equal(t, run.ID, p.RunID)
	secs, err := strconv.Atoi(busy.header.Get("Retry-After"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, secs, 1)

	// The execution goes on after the 202 and finishes.
	close(b.release)
	require.Eventually(t, func() bool {
		return decode[runJSON](t, b.do(t, http.MethodGet, "/v1/runs/"+run.ID, "")).Status == "succeeded"
	}, 10*time.Second, 10*time.Millisecond)
	done := b.start(t, "slow", "s1", `{"value":"x"}`)
	require.Equal(t, http.StatusCreated, done.status)
	require.Equal(t, "true", done.header.Get("Idempotent-Replayed"))
}

func TestUnleasedUnfinishedRunIsAcceptedAndTakenOver(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	tx, err := b.pool.Begin(context.Background())
	require.NoError(t, err)
	res, err := b.engine.StartTx(context.Background(), tx, engine.StartParams{Workflow: "echo", IdempotencyKey: "u1", Input: []byte(`{"value":"u"}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(context.Background()))

	r := b.start(t, "echo", "u1", `{"value":"u"}`)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	require.Equal(t, res.Run.ID, decode[runJSON](t, r).ID)
	require.Eventually(t, func() bool { return b.counter(t, "u") == 1 }, 10*time.Second, 10*time.Millisecond, "taken over")
}

func TestBadRequestsGetProblems(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	json := "application/json"
	cases := []struct {
		name   string
		path   string
		body   string
		header []string
		status int
		code   string
	}{
		{"missing key", "/v1/workflows/echo/runs", `{}`, []string{"Content-Type", json}, 400, "missing_idempotency_key"},
		{"empty key", "/v1/workflows/echo/runs", `{}`, []string{"Content-Type", json, "Idempotency-Key", `""`}, 400, "invalid_idempotency_key"},
		{"key over 255", "/v1/workflows/echo/runs", `{}`, []string{"Content-Type", json, "Idempotency-Key", strings.Repeat("k", 256)}, 400, "invalid_idempotency_key"},
		{"key not ASCII", "/v1/workflows/echo/runs", `{}`, []string{"Content-Type", json, "Idempotency-Key", "clé"}, 400, "invalid_idempotency_key"},
		{"unterminated structured key", "/v1/workflows/echo/runs", `{}`, []string{"Content-Type", json, "Idempotency-Key", `"abc`}, 400, "invalid_idempotency_key"},
		{"two keys", "/v1/workflows/echo/runs", `{}`, []string{"Content-Type", json, "Idempotency-Key", "a", "Idempotency-Key", "b"}, 400, "invalid_idempotency_key"},
		{"malformed JSON", "/v1/workflows/echo/runs", `{"value":`, []string{"Content-Type", json, "Idempotency-Key", "k"}, 400, "malformed_json"},
		{"input of the wrong type", "/v1/workflows/echo/runs", `{"value":1}`, []string{"Content-Type", json, "Idempotency-Key", "k"}, 400, "invalid_input"},
		{"wrong content type", "/v1/workflows/echo/runs", `{}`, []string{"Content-Type", "text/plain", "Idempotency-Key", "k"}, 415, "unsupported_media_type"},
		{"no content type", "/v1/workflows/echo/runs", `{}`, []string{"Idempotency-Key", "k"}, 415, "unsupported_media_type"},
		{"unknown workflow", "/v1/workflows/refund/runs", `{}`, []string{"Content-Type", json, "Idempotency-Key", "k"}, 404, "unknown_workflow"},
		{"body over 1 MiB", "/v1/workflows/echo/runs", `{"value":"` + strings.Repeat("x", 1<<20) + `"}`, []string{"Content-Type", json, "Idempotency-Key", "k"}, 413, "body_too_large"},
	}
	for _, tc := range cases {
		r := b.do(t, http.MethodPost, tc.path, tc.body, tc.header...)
		t.Run(tc.name, func(t *testing.T) { requireProblem(t, r, tc.status, tc.code) })
	}
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM ratchet.runs`).Scan(&n))
	require.Zero(t, n, "no bad request created a run")
}

func TestSameKeyDifferentInputIsUnprocessable(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := b.start(t, "echo", "k1", `{"value":"a"}`)
	require.Equal(t, http.StatusCreated, first.status)
	p := requireProblem(t, b.start(t, "echo", "k1", `{"value":"b"}`), http.StatusUnprocessableEntity, "idempotency_key_reused")
	require.Contains(t, p.Detail, decode[runJSON](t, first).ID)
	require.Zero(t, b.counter(t, "b"))
}

func TestAuthenticationAndTenantIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t, &api.Config{Tokens: map[string]string{"token-a": "tenant-a", "token-b": "tenant-b"}})
	asA := []string{"Authorization", "Bearer token-a"}
	asB := []string{"Authorization", "Bearer token-b"}

	requireProblem(t, b.start(t, "echo", "k", `{"value":"a"}`), http.StatusUnauthorized, "unauthorized")
	bad := b.start(t, "echo", "k", `{"value":"a"}`, "Authorization", "Bearer nope")
	requireProblem(t, bad, http.StatusUnauthorized, "unauthorized")
	require.Equal(t, `Bearer realm="ratchet"`, bad.header.Get("WWW-Authenticate"))

	a := b.start(t, "echo", "shared-key", `{"value":"a"}`, asA...)
	require.Equal(t, http.StatusCreated, a.status, "%s", a)
	runA := decode[runJSON](t, a)

	// B's request with the same key is B's own run, not A's replay.
	bResp := b.start(t, "echo", "shared-key", `{"value":"b"}`, asB...)
	require.Equal(t, http.StatusCreated, bResp.status, "%s", bResp)
	require.Empty(t, bResp.header.Get("Idempotent-Replayed"))
	require.NotEqual(t, runA.ID, decode[runJSON](t, bResp).ID)

	requireProblem(t, b.do(t, http.MethodGet, "/v1/runs/"+runA.ID, "", asB...), http.StatusNotFound, "run_not_found")
	requireProblem(t, b.do(t, http.MethodPost, "/v1/runs/"+runA.ID+"/cancel", "", asB...), http.StatusNotFound, "run_not_found")
	list := decode[struct{ Data []runJSON }](t, b.do(t, http.MethodGet, "/v1/runs", "", asB...))
	require.Len(t, list.Data, 1)
	require.NotEqual(t, runA.ID, list.Data[0].ID)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/runs/"+runA.ID, "", asA...).status)
}

func TestGetRunShowsItsJournal(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	run := decode[runJSON](t, b.start(t, "echo", "k", `{"value":"a"}`))
	got := decode[runJSON](t, b.do(t, http.MethodGet, "/v1/runs/"+run.ID, ""))
	require.Equal(t, run.ID, got.ID)
	require.Len(t, got.Phases, 1)
	require.Equal(t, "stored", got.Phases[0].Name)
	requireProblem(t, b.do(t, http.MethodGet, "/v1/runs/nope", ""), http.StatusNotFound, "run_not_found")
}

func TestCancelAndResumeEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	// Cancel: an unleased run is cancelled at once; a finished one is a conflict.
	tx, err := b.pool.Begin(context.Background())
	require.NoError(t, err)
	res, err := b.engine.StartTx(context.Background(), tx, engine.StartParams{Workflow: "echo", IdempotencyKey: "c1", Input: []byte(`{"value":"c"}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(context.Background()))
	r := b.do(t, http.MethodPost, "/v1/runs/"+res.Run.ID+"/cancel", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	require.Equal(t, "cancelled", decode[runJSON](t, r).Status)
	requireProblem(t, b.do(t, http.MethodPost, "/v1/runs/"+res.Run.ID+"/cancel", ""), http.StatusConflict, "run_finished")
	replay := b.start(t, "echo", "c1", `{"value":"c"}`)
	requireProblem(t, replay, http.StatusConflict, "run_cancelled")

	// Cancel of a run a live executor holds is accepted.
	slow := decode[runJSON](t, b.start(t, "slow", "c2", `{"value":"s"}`, "Prefer", "wait=0"))
	r = b.do(t, http.MethodPost, "/v1/runs/"+slow.ID+"/cancel", "")
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)

	// Resume: only a failed run.
	failed := requireProblem(t, b.start(t, "pay", "p1", `{"customer":"cus_declined","amount":1}`), http.StatusPaymentRequired, "card_declined")
	r = b.do(t, http.MethodPost, "/v1/runs/"+failed.RunID+"/resume", "")
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	require.Eventually(t, func() bool {
		return decode[runJSON](t, b.do(t, http.MethodGet, "/v1/runs/"+failed.RunID, "")).Status == "failed"
	}, 10*time.Second, 10*time.Millisecond, "re-executed (and declined again)")
	ok := decode[runJSON](t, b.start(t, "echo", "ok", `{"value":"o"}`))
	requireProblem(t, b.do(t, http.MethodPost, "/v1/runs/"+ok.ID+"/resume", ""), http.StatusConflict, "run_not_failed")
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/healthz", "").status)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/readyz", "").status)

	_, err := b.pool.Exec(context.Background(), `DELETE FROM ratchet.schema_migrations WHERE version = 2`)
	require.NoError(t, err)
	requireProblem(t, b.do(t, http.MethodGet, "/readyz", ""), http.StatusServiceUnavailable, "unavailable")
}

func TestListFiltersValidateAndFindChildKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	requireProblem(t, b.do(t, http.MethodGet, "/v1/runs?limit=0", ""), http.StatusBadRequest, "invalid_query")
	requireProblem(t, b.do(t, http.MethodGet, "/v1/runs?limit=x", ""), http.StatusBadRequest, "invalid_query")
	requireProblem(t, b.do(t, http.MethodGet, "/v1/runs?status=done", ""), http.StatusBadRequest, "invalid_query")

	b.start(t, "charge", "other", `{"customer":"cus_1","amount":3}`)
	run := decode[runJSON](t, b.start(t, "charge", "k", `{"customer":"cus_1","amount":5}`))
	got := decode[runJSON](t, b.do(t, http.MethodGet, "/v1/runs/"+run.ID, ""))
	require.Len(t, got.Phases, 1)
	childKey := *got.Phases[0].ChildKey
	stored, err := b.engine.GetRun(context.Background(), run.ID)
	require.NoError(t, err)
	require.Equal(t, enginetest.ChildKey(t, stored, "charged"), childKey)

	list := decode[struct{ Data []runJSON }](t, b.do(t, http.MethodGet, "/v1/runs?child_key="+childKey, ""))
	require.Len(t, list.Data, 1, "the child key finds the run that issued it")
	require.Equal(t, run.ID, list.Data[0].ID)
	list = decode[struct{ Data []runJSON }](t, b.do(t, http.MethodGet, "/v1/runs?workflow=charge&status=succeeded&idempotency_key=k", ""))
	require.Len(t, list.Data, 1)
}

func TestDatabaseConflictsAreConflictsNotServerErrors(t *testing.T) {
	t.Parallel()
	// Serialization failures, deadlocks, unique violations and lock
	// timeouts are conflicts the client may retry: never a 5xx.
	for _, code := range []string{"40001", "40P01", "23505", "55P03"} {
		require.Equal(t, http.StatusConflict, api.StatusOf(&pgconn.PgError{Code: code}), code)
	}
	require.Equal(t, http.StatusInternalServerError, api.StatusOf(pgx.ErrTxClosed))
}

func TestServerIsHardened(t *testing.T) {
	t.Parallel()
	b := setup(t, &api.Config{MaxWait: 30 * time.Second})
	srv := b.handler.NewServer(":0", nil)
	require.Same(t, b.handler, srv.Handler)
	require.Equal(t, 5*time.Second, srv.ReadHeaderTimeout)
	require.Equal(t, 30*time.Second, srv.ReadTimeout)
	require.Equal(t, 40*time.Second, srv.WriteTimeout, "longer than the longest inline wait")
	require.Equal(t, 2*time.Minute, srv.IdleTimeout)
	require.Equal(t, 64<<10, srv.MaxHeaderBytes)
}
