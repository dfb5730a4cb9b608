package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/api"
)

// A sleeping run is answered 202 at once, and its resource says what it
// waits for and until when.
func TestASleepingRunShowsWhatItWaitsFor(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	type waiting struct {
		ID         string `json:"id"`
		Status     string `json:"status"`
		WaitingFor *struct {
			Kind  string    `json:"kind"`
			Phase string    `json:"phase"`
			Until time.Time `json:"until"`
		} `json:"waiting_for"`
	}
	began := time.Now()
	r := b.start(t, "nap", "k", `{"value":"z"}`)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	run := decode[waiting](t, r)
	require.Equal(t, "waiting", run.Status)
	require.NotNil(t, run.WaitingFor)
	require.Equal(t, "sleep", run.WaitingFor.Kind)
	require.Equal(t, "napped", run.WaitingFor.Phase)
	require.WithinDuration(t, began.Add(time.Hour), run.WaitingFor.Until, time.Minute)

	got := decode[waiting](t, b.do(t, http.MethodGet, r.header.Get("Location"), ""))
	require.Equal(t, run, got)

	// Cancelled, it is finished: nothing is waited for any more.
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/runs/"+run.ID+"/cancel", "").status)
	require.Nil(t, decode[waiting](t, b.do(t, http.MethodGet, r.header.Get("Location"), "")).WaitingFor)
}

type signalJSON struct {
	ID             int64  `json:"id"`
	Name           string `json:"name"`
	EventID        string `json:"event_id"`
	RunID          string `json:"run_id"`
	CorrelationKey string `json:"correlation_key"`
	Delivered      bool   `json:"delivered"`
}

func TestSignalsOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, &api.Config{Tokens: map[string]string{"token-a": "a", "token-b": "b"}})
	authA, authB := []string{"Authorization", "Bearer token-a"}, []string{"Authorization", "Bearer token-b"}
	ctx := context.Background()
	signal := func(path, event, body string, auth []string) response {
		return b.do(t, http.MethodPost, path, body, append([]string{"Content-Type", "application/json", "Idempotency-Key", event}, auth...)...)
	}

	started := b.start(t, "approval", "order-1", `{"value":"ap_1"}`, authA...)
	require.Equal(t, http.StatusAccepted, started.status, "%s", started)
	run := decode[runJSON](t, started)
	require.Equal(t, "waiting", run.Status)

	r := signal("/v1/signals/approved?correlation_key=ap_1", "evt_1", `{"value":"yes"}`, authA)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	first := decode[signalJSON](t, r)
	require.Equal(t, signalJSON{ID: first.ID, Name: "approved", EventID: "evt_1", RunID: run.ID, CorrelationKey: "ap_1", Delivered: true}, first)
	require.Equal(t, "/v1/runs/"+run.ID, r.header.Get("Location"))

	again := signal("/v1/signals/approved?correlation_key=ap_1", "evt_1", `{"value": "yes"}`, authA)
	require.Equal(t, http.StatusOK, again.status, "a redelivered webhook")
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, first, decode[signalJSON](t, again), "answered like the first")
	requireProblem(t, signal("/v1/signals/approved?correlation_key=ap_1", "evt_1", `{"value":"no"}`, authA), http.StatusUnprocessableEntity, "event_id_reused")

	done, err := b.engine.TakeOver(ctx, run.ID) // what a worker does at once
	require.NoError(t, err)
	require.Equal(t, "succeeded", string(done.Status))
	requireProblem(t, signal("/v1/runs/"+run.ID+"/signals/approved", "evt_2", `{}`, authA), http.StatusConflict, "run_finished")

	// Tenancy: tenant b neither reaches a's run by id nor wakes it by key.
	waiting := decode[runJSON](t, b.start(t, "approval", "order-2", `{"value":"ap_2"}`, authA...))
	requireProblem(t, signal("/v1/runs/"+waiting.ID+"/signals/approved", "evt_3", `{}`, authB), http.StatusNotFound, "run_not_found")
	byKey := decode[signalJSON](t, signal("/v1/signals/approved?correlation_key=ap_2", "evt_4", `{}`, authB))
	require.False(t, byKey.Delivered)
	require.Empty(t, byKey.RunID)
	requireProblem(t, signal("/v1/signals/approved?correlation_key=nobody&require_match=true", "evt_5", `{}`, authA), http.StatusNotFound, "no_matching_run")

	// To the run by id, as its own Await expects.
	r = signal("/v1/runs/"+waiting.ID+"/signals/approved", "evt_6", `{"value":"ok"}`, authA)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	require.True(t, decode[signalJSON](t, r).Delivered)

	// Bad requests.
	requireProblem(t, signal("/v1/signals/approved", "evt_7", `{}`, authA), http.StatusBadRequest, "invalid_query")
	requireProblem(t, b.do(t, http.MethodPost, "/v1/signals/approved?correlation_key=k", `{}`, append([]string{"Content-Type", "application/json"}, authA...)...), http.StatusBadRequest, "missing_idempotency_key")
	requireProblem(t, signal("/v1/signals/approved?correlation_key=k", "evt_8", `{`, authA), http.StatusBadRequest, "malformed_json")
	requireProblem(t, signal("/v1/signals/a%20b?correlation_key=k", "evt_9", `{}`, authA), http.StatusBadRequest, "invalid_signal")
	requireProblem(t, signal("/v1/runs/not-a-run/signals/approved", "evt_10", `{}`, authA), http.StatusNotFound, "run_not_found")
}
