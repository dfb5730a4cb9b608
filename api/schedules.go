package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/ratchet-run/ratchet/engine"
)

// scheduleBody is PUT /v1/schedules/{name}'s body: engine.Schedule, with
// every in seconds.
type scheduleBody struct {
	Cron     string          `json:"cron"`
	Every    float64         `json:"every"`
	TimeZone string          `json:"time_zone"`
	Workflow string          `json:"workflow"`
	Input    json.RawMessage `json:"input"`
	CatchUp  engine.CatchUp  `json:"catch_up"`
	Overlap  engine.Overlap  `json:"overlap"`
}

// scheduleResource is a schedule as the API answers it (engine.ScheduleState).
type scheduleResource struct {
	Name     string          `json:"name"`
	Cron     string          `json:"cron,omitempty"`
	TimeZone string          `json:"time_zone,omitempty"`
	Every    float64         `json:"every,omitempty"` // seconds
	Workflow string          `json:"workflow"`
	Input    json.RawMessage `json:"input"`
	CatchUp  engine.CatchUp  `json:"catch_up"`
	Overlap  engine.Overlap  `json:"overlap"`
	Source   string          `json:"source"`
	Paused   bool            `json:"paused"`
	// NextTickAt is the next tick not yet started or skipped; LastTickAt
	// and LastRunID the last that started a run, and the run.
	NextTickAt time.Time  `json:"next_tick_at"`
	LastTickAt *time.Time `json:"last_tick_at,omitempty"`
	LastRunID  *string    `json:"last_run_id,omitempty"`
	Started    int64      `json:"started"`
	Skipped    int64      `json:"skipped"`
	CreatedAt  time.Time  `json:"created_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
}

func newScheduleResource(s *engine.ScheduleState) scheduleResource {
	return scheduleResource{Name: s.Name, Cron: s.Cron, TimeZone: s.TimeZone, Every: s.Every.Seconds(), Workflow: s.Workflow, Input: s.Input,
		CatchUp: s.CatchUp, Overlap: s.Overlap, Source: s.Source, Paused: s.Paused, NextTickAt: s.NextTickAt.UTC(), LastTickAt: utc(s.LastTickAt),
		LastRunID: s.LastRunID, Started: s.Started, Skipped: s.Skipped, CreatedAt: s.CreatedAt.UTC(), UpdatedAt: s.UpdatedAt.UTC()}
}

// maxEvery bounds an interval schedule's period, so that it is a
// duration at all.
const maxEvery = 366 * 24 * time.Hour

// listSchedules is GET /v1/schedules: the tenant's schedules by name.
func (h *Handler) listSchedules(w http.ResponseWriter, r *http.Request, tenant string) {
	all, err := h.engine.ListSchedules(r.Context(), tenant)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	data := make([]scheduleResource, 0, len(all))
	for _, s := range all {
		data = append(data, newScheduleResource(s))
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": data})
}

// getSchedule is GET /v1/schedules/{name}.
func (h *Handler) getSchedule(w http.ResponseWriter, r *http.Request, tenant string) {
	s, err := h.engine.GetSchedule(r.Context(), tenant, r.PathValue("name"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newScheduleResource(s))
}

// putSchedule is PUT /v1/schedules/{name}: declares the schedule or
// replaces its declaration (engine.Client.PutSchedule).
func (h *Handler) putSchedule(w http.ResponseWriter, r *http.Request, tenant string) {
	raw, ok := h.readJSON(w, r)
	if !ok {
		return
	}
	var body scheduleBody
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		h.fail(w, r, fmt.Errorf("%w: the body: %v", engine.ErrInvalidSchedule, err))
		return
	}
	if body.Every < 0 || body.Every != math.Trunc(body.Every) || body.Every > maxEvery.Seconds() {
		h.fail(w, r, fmt.Errorf("%w: every %v: want a whole number of seconds, at most %d", engine.ErrInvalidSchedule, body.Every, int(maxEvery.Seconds())))
		return
	}
	s, err := h.engine.PutSchedule(r.Context(), engine.Schedule{
		Name: r.PathValue("name"), Tenant: tenant, Cron: body.Cron, Every: time.Duration(body.Every) * time.Second,
		TimeZone: body.TimeZone, Workflow: body.Workflow, Input: body.Input, CatchUp: body.CatchUp, Overlap: body.Overlap,
	})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newScheduleResource(s))
}

// deleteSchedule is DELETE /v1/schedules/{name}; the runs it started stay.
func (h *Handler) deleteSchedule(w http.ResponseWriter, r *http.Request, tenant string) {
	if err := h.engine.DeleteSchedule(r.Context(), tenant, r.PathValue("name")); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pauseSchedule is POST /v1/schedules/{name}/pause and /resume.
func (h *Handler) pauseSchedule(paused bool) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, r *http.Request, tenant string) {
		s, err := h.engine.PauseSchedule(r.Context(), tenant, r.PathValue("name"), paused)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, newScheduleResource(s))
	}
}

// triggerSchedule is POST /v1/schedules/{name}/trigger: a run of the
// schedule now, keyed by the schedule and the Idempotency-Key. The answer
// is the run resource: 201 when this trigger started it and it finished
// within the default wait, 200 (Idempotent-Replayed) when the key had
// already, 202 while it runs on.
func (h *Handler) triggerSchedule(w http.ResponseWriter, r *http.Request, tenant string) {
	key, err := parseIdempotencyKey(r.Header.Values("Idempotency-Key"))
	if err != nil {
		code := codeInvalidKey
		if errors.Is(err, errMissingKey) {
			code = codeMissingKey
		}
		writeProblem(w, problem{Status: http.StatusBadRequest, Code: code, Title: "Idempotency-Key missing or invalid", Detail: err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), max(h.cfg.DefaultWait, time.Millisecond))
	defer cancel()
	res, err := h.engine.TriggerSchedule(ctx, tenant, r.PathValue("name"), key)
	if res == nil {
		h.fail(w, r, err)
		return
	}
	if !res.Run.Status.Finished() {
		h.writeAccepted(w, res.Run)
		return
	}
	status := http.StatusCreated
	if res.Outcome != engine.OutcomeCreated {
		status = http.StatusOK
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Location", h.runPath(res.Run.ID))
	writeJSON(w, status, newRunResource(res.Run, nil))
}
