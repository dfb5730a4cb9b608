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

// A start may put its run in a declared queue, at a priority: it is
// answered 202 waiting there, and the run resource says where. An unknown
// queue or a malformed header is a 400 that creates nothing.
func TestAStartCanWaitInAQueueAtAPriority(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.start(t, "echo", "q-1", `{"value": "x"}`, "Ratchet-Queue", "outbound", "Ratchet-Priority", "7")
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	var started struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(r.body, &started))
	var run struct {
		Status string `json:"status"`
		Queue  *struct {
			Name      string  `json:"name"`
			Priority  int     `json:"priority"`
			StartedAt *string `json:"started_at"`
		} `json:"queue"`
		WaitingFor struct {
			Kind  string `json:"kind"`
			Queue string `json:"queue"`
		} `json:"waiting_for"`
		Blocked struct {
			Reason     string `json:"reason"`
			Queue      string `json:"queue"`
			Priority   int    `json:"priority"`
			Detail     string `json:"detail"`
			QueueState *struct {
				Concurrency int `json:"concurrency"`
				Ahead       int `json:"ahead"`
			} `json:"queue_state"`
		} `json:"blocked"`
	}
	got := b.do(t, http.MethodGet, "/v1/runs/"+started.ID, "")
	require.NoError(t, json.Unmarshal(got.body, &run), "%s", got)
	require.Equal(t, "pending", run.Status)
	require.NotNil(t, run.Queue)
	require.Equal(t, "outbound", run.Queue.Name)
	require.Equal(t, 7, run.Queue.Priority)
	require.Nil(t, run.Queue.StartedAt)
	require.Equal(t, "queue", run.WaitingFor.Kind)
	require.Equal(t, "outbound", run.WaitingFor.Queue)
	require.Equal(t, "queued", run.Blocked.Reason)
	require.Equal(t, 7, run.Blocked.Priority)
	require.Contains(t, run.Blocked.Detail, `waiting in queue "outbound" (priority 7)`)
	require.Zero(t, b.executions.Load(), "nothing executed inline")

	listed := b.do(t, http.MethodGet, "/v1/runs?blocked=queued", "")
	require.Equal(t, http.StatusOK, listed.status, "%s", listed)
	require.Contains(t, string(listed.body), started.ID)

	for _, bad := range []struct {
		headers []string
		code    string
	}{
		{[]string{"Ratchet-Queue", "nowhere"}, "unknown_queue"},
		{[]string{"Ratchet-Queue", "two words"}, "invalid_queue"},
		{[]string{"Ratchet-Queue", "outbound", "Ratchet-Queue", "outbound"}, "invalid_queue"},
		{[]string{"Ratchet-Queue", "outbound", "Ratchet-Priority", "high"}, "invalid_queue"},
		{[]string{"Ratchet-Queue", "outbound", "Ratchet-Priority", "99999999999"}, "invalid_queue"},
		{[]string{"Ratchet-Priority", "3"}, "invalid_input"},
	} {
		r := b.start(t, "echo", "bad-q", `{"value": "x"}`, bad.headers...)
		require.Equal(t, http.StatusBadRequest, r.status, "%v: %s", bad.headers, r)
		var p struct {
			Code string `json:"code"`
		}
		require.NoError(t, json.Unmarshal(r.body, &p))
		require.Equal(t, bad.code, p.Code, "%v: %s", bad.headers, r)
	}
	var runs int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM ratchet.runs WHERE idempotency_key = 'bad-q'`).Scan(&runs))
	require.Zero(t, runs, "a bad start creates no run")
}

// A parent's resource lists its children; a child's names its parent;
// the parent's wait names the child.
func TestARunShowsItsParentAndChildren(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.start(t, "family", "fam-1", `{"value": "f"}`)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	type runJSON struct {
		ID          string  `json:"id"`
		Status      string  `json:"status"`
		ParentRunID *string `json:"parent_run_id"`
		Children    []struct {
			ID       string `json:"id"`
			Workflow string `json:"workflow"`
			Status   string `json:"status"`
		} `json:"children"`
		WaitingFor struct {
			Kind  string `json:"kind"`
			Child string `json:"child"`
		} `json:"waiting_for"`
		Blocked struct {
			Reason string `json:"reason"`
		} `json:"blocked"`
	}
	var started runJSON
	require.NoError(t, json.Unmarshal(r.body, &started))
	var parent runJSON
	got := b.do(t, http.MethodGet, "/v1/runs/"+started.ID, "")
	require.NoError(t, json.Unmarshal(got.body, &parent), "%s", got)
	require.Equal(t, "waiting", parent.Status)
	require.Nil(t, parent.ParentRunID)
	require.Len(t, parent.Children, 1)
	require.Equal(t, "echo", parent.Children[0].Workflow)
	require.Equal(t, "pending", parent.Children[0].Status)
	require.Equal(t, "await_child", parent.WaitingFor.Kind)
	require.Equal(t, parent.Children[0].ID, parent.WaitingFor.Child)
	require.Equal(t, "child", parent.Blocked.Reason)

	var child runJSON
	got = b.do(t, http.MethodGet, "/v1/runs/"+parent.Children[0].ID, "")
	require.NoError(t, json.Unmarshal(got.body, &child), "%s", got)
	require.NotNil(t, child.ParentRunID)
	require.Equal(t, started.ID, *child.ParentRunID)
	require.Empty(t, child.Children)
}
