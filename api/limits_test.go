package api_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// A run over its key's limit is answered 202 and shows what it waits for:
// the key, its limit, the runs holding its slots. Bad override headers
// and a key the input lacks are 400s that create nothing.
func TestAQueuedRunShowsItsKeyAndWhoHoldsTheSlot(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	type shown struct {
		ID          string `json:"id"`
		Status      string `json:"status"`
		Concurrency *struct {
			Key       string `json:"key"`
			Limit     int    `json:"limit"`
			HoldsSlot bool   `json:"holds_slot"`
		} `json:"concurrency"`
		WaitingFor *struct {
			Kind string `json:"kind"`
			Key  string `json:"key"`
		} `json:"waiting_for"`
		Blocked *struct {
			Reason  string   `json:"reason"`
			Key     string   `json:"concurrency_key"`
			Limit   int      `json:"limit"`
			Holders []string `json:"holders"`
			Detail  string   `json:"detail"`
		} `json:"blocked"`
	}
	decode := func(r response) shown {
		t.Helper()
		var s shown
		require.NoError(t, json.Unmarshal(r.body, &s), "%s", r)
		return s
	}

	first := b.start(t, "serial", "s-1", `{"value": "acct_1"}`, "Prefer", "wait=0")
	require.Equal(t, http.StatusAccepted, first.status, "%s", first)
	holder := decode(first)
	second := b.start(t, "serial", "s-2", `{"value": "acct_1"}`, "Prefer", "wait=5")
	require.Equal(t, http.StatusAccepted, second.status, "queued, not refused: %s", second)
	queued := decode(b.do(t, http.MethodGet, "/v1/runs/"+decode(second).ID, ""))
	require.Equal(t, "pending", queued.Status)
	require.NotNil(t, queued.Concurrency)
	require.Equal(t, "serial/acct_1", queued.Concurrency.Key)
	require.Equal(t, 1, queued.Concurrency.Limit)
	require.False(t, queued.Concurrency.HoldsSlot)
	require.Equal(t, "concurrency", queued.WaitingFor.Kind)
	require.Equal(t, "serial/acct_1", queued.WaitingFor.Key)
	require.NotNil(t, queued.Blocked)
	require.Equal(t, "concurrency", queued.Blocked.Reason)
	require.Equal(t, "serial/acct_1", queued.Blocked.Key)
	require.Equal(t, []string{holder.ID}, queued.Blocked.Holders)

	// The start's own key and limit.
	own := b.start(t, "slow", "own", `{"value": "x"}`, "Prefer", "wait=0",
		"Ratchet-Concurrency-Key", `"acct 2"`, "Ratchet-Concurrency-Limit", "3")
	require.Equal(t, http.StatusAccepted, own.status, "%s", own)
	ownRun := decode(b.do(t, http.MethodGet, "/v1/runs/"+decode(own).ID, ""))
	require.NotNil(t, ownRun.Concurrency)
	require.Equal(t, "slow/acct 2", ownRun.Concurrency.Key)
	require.Equal(t, 3, ownRun.Concurrency.Limit)

	for _, bad := range []struct {
		workflow, body string
		headers        []string
		code           string
	}{
		{"serial", `{}`, nil, "invalid_input"},
		{"serial", `{"value": "x"}`, []string{"Ratchet-Concurrency-Limit", "0"}, "invalid_concurrency"},
		{"serial", `{"value": "x"}`, []string{"Ratchet-Concurrency-Limit", "-2"}, "invalid_concurrency"},
		{"serial", `{"value": "x"}`, []string{"Ratchet-Concurrency-Limit", "many"}, "invalid_concurrency"},
		{"serial", `{"value": "x"}`, []string{"Ratchet-Concurrency-Key", "a b"}, "invalid_concurrency"},
		{"serial", `{"value": "x"}`, []string{"Ratchet-Concurrency-Key", "a", "Ratchet-Concurrency-Key", "b"}, "invalid_concurrency"},
		{"slow", `{"value": "x"}`, []string{"Ratchet-Concurrency-Key", `"unterminated`}, "invalid_concurrency"},
	} {
		r := b.start(t, bad.workflow, "bad", bad.body, bad.headers...)
		require.Equal(t, http.StatusBadRequest, r.status, "%v: %s", bad.headers, r)
		var p struct {
			Code string `json:"code"`
		}
		require.NoError(t, json.Unmarshal(r.body, &p))
		require.Equal(t, bad.code, p.Code, "%s", r)
	}
	var runs int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM ratchet.runs WHERE idempotency_key = 'bad'`).Scan(&runs))
	require.Zero(t, runs, "a bad start creates no run")
}
