package api_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type scheduleJSON struct {
	Name       string    `json:"name"`
	Cron       string    `json:"cron"`
	Every      float64   `json:"every"`
	TimeZone   string    `json:"time_zone"`
	Workflow   string    `json:"workflow"`
	CatchUp    string    `json:"catch_up"`
	Overlap    string    `json:"overlap"`
	Source     string    `json:"source"`
	Paused     bool      `json:"paused"`
	NextTickAt time.Time `json:"next_tick_at"`
	Started    int       `json:"started"`
}

// Schedules over HTTP: put, list, read, pause, resume, trigger (once per
// key), delete.
func TestSchedulesOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	decode := func(r response) scheduleJSON {
		t.Helper()
		var s scheduleJSON
		require.NoError(t, json.Unmarshal(r.body, &s), "%s", r)
		return s
	}
	jsonHeader := []string{"Content-Type", "application/json"}
	put := b.do(t, http.MethodPut, "/v1/schedules/nightly",
		`{"cron": "0 2 * * *", "time_zone": "Europe/Paris", "workflow": "echo", "input": {"value": "night"}, "catch_up": "all"}`, jsonHeader...)
	require.Equal(t, http.StatusOK, put.status, "%s", put)
	s := decode(put)
	require.Equal(t, scheduleJSON{Name: "nightly", Cron: "0 2 * * *", TimeZone: "Europe/Paris", Workflow: "echo", CatchUp: "all", Overlap: "skip",
		Source: "api", NextTickAt: s.NextTickAt}, s)
	require.True(t, s.NextTickAt.After(time.Now()))
	paris, err := time.LoadLocation("Europe/Paris")
	require.NoError(t, err)
	require.Equal(t, 2, s.NextTickAt.In(paris).Hour(), "02:00 in Paris")

	every := b.do(t, http.MethodPut, "/v1/schedules/minutely", `{"every": 60, "workflow": "echo", "input": {"value": "m"}}`, jsonHeader...)
	require.Equal(t, http.StatusOK, every.status, "%s", every)
	require.Equal(t, 60.0, decode(every).Every)

	list := b.do(t, http.MethodGet, "/v1/schedules", "")
	require.Equal(t, http.StatusOK, list.status)
	var page struct {
		Data []scheduleJSON `json:"data"`
	}
	require.NoError(t, json.Unmarshal(list.body, &page))
	require.Len(t, page.Data, 2)
	require.Equal(t, "minutely", page.Data[0].Name)

	paused := b.do(t, http.MethodPost, "/v1/schedules/nightly/pause", "")
	require.Equal(t, http.StatusOK, paused.status, "%s", paused)
	require.True(t, decode(paused).Paused)
	resumed := b.do(t, http.MethodPost, "/v1/schedules/nightly/resume", "")
	require.False(t, decode(resumed).Paused)

	trig := b.do(t, http.MethodPost, "/v1/schedules/nightly/trigger", "", "Idempotency-Key", "ops-1")
	require.Equal(t, http.StatusCreated, trig.status, "%s", trig)
	require.Contains(t, trig.header.Get("Location"), "/v1/runs/")
	again := b.do(t, http.MethodPost, "/v1/schedules/nightly/trigger", "", "Idempotency-Key", "ops-1")
	require.Equal(t, http.StatusOK, again.status)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, trig.header.Get("Location"), again.header.Get("Location"))
	require.Equal(t, 1, b.counter(t, "night"), "one run for the two triggers")

	require.Equal(t, http.StatusNoContent, b.do(t, http.MethodDelete, "/v1/schedules/minutely", "").status)
	gone := b.do(t, http.MethodGet, "/v1/schedules/minutely", "")
	require.Equal(t, http.StatusNotFound, gone.status)
	require.Contains(t, string(gone.body), "schedule_not_found")
}

// Bad schedules are 4xx with a reason, never a 500, and store nothing.
func TestBadSchedulesAreRefusedOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, bad := range []struct {
		body   string
		status int
		code   string
	}{
		{`{"cron": "61 * * * *", "workflow": "echo", "input": {"value": "x"}}`, 400, "invalid_schedule"},
		{`{"cron": "0 0 * * *", "time_zone": "Mars/Olympus", "workflow": "echo", "input": {"value": "x"}}`, 400, "invalid_schedule"},
		{`{"cron": "0 0 * * *", "workflow": "nope", "input": {}}`, 400, "invalid_schedule"},
		{`{"cron": "0 0 * * *", "workflow": "echo", "input": [1]}`, 400, "invalid_schedule"},
		{`{"every": 1.5, "workflow": "echo", "input": {"value": "x"}}`, 400, "invalid_schedule"},
		{`{"every": -60, "workflow": "echo", "input": {"value": "x"}}`, 400, "invalid_schedule"},
		{`{"every": 1e300, "workflow": "echo", "input": {"value": "x"}}`, 400, "invalid_schedule"},
		{`{"workflow": "echo", "input": {"value": "x"}}`, 400, "invalid_schedule"},
		{`{"cron": "@daily", "workflow": "echo", "catch_up": "sometimes"}`, 400, "invalid_schedule"},
		{`{"cron": "@daily", "workflow": "echo", "color": "red"}`, 400, "invalid_schedule"},
		{`{"cron": `, 400, ""},
	} {
		r := b.do(t, http.MethodPut, "/v1/schedules/bad", bad.body, "Content-Type", "application/json")
		require.Equal(t, bad.status, r.status, "%s: %s", bad.body, r)
		if bad.code != "" {
			require.Contains(t, string(r.body), `"code":"`+bad.code+`"`, "%s", bad.body)
		}
	}
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodPost, "/v1/schedules/bad/pause", "").status)
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodPost, "/v1/schedules/bad/trigger", "", "Idempotency-Key", "k").status)
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPost, "/v1/schedules/bad/trigger", "").status, "the key is required")
	var n int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM ratchet.schedules`).Scan(&n))
	require.Zero(t, n)
}
