package api

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/ratchet-run/ratchet/engine"
)

// signalResource is a signal as the API answers it.
type signalResource struct {
	ID             int64  `json:"id"`
	Name           string `json:"name"`
	EventID        string `json:"event_id"`
	RunID          string `json:"run_id,omitempty"`
	CorrelationKey string `json:"correlation_key,omitempty"`
	// Delivered says a waiting run was woken to consume it; otherwise it
	// is queued until a run awaits it.
	Delivered bool `json:"delivered"`
}

// signalRun is POST /v1/runs/{id}/signals/{name}: a signal to one run.
func (h *Handler) signalRun(w http.ResponseWriter, r *http.Request, tenant string) {
	h.signal(w, r, engine.SignalParams{Tenant: tenant, RunID: r.PathValue("id")})
}

// signalByKey is POST /v1/signals/{name}?correlation_key=K: a signal to
// whichever run awaits it with that key, now or later.
// require_match=true refuses it (404) when none awaits it now.
func (h *Handler) signalByKey(w http.ResponseWriter, r *http.Request, tenant string) {
	q := r.URL.Query()
	key := q.Get("correlation_key")
	if key == "" {
		writeProblem(w, problem{Status: http.StatusBadRequest, Code: codeInvalidQuery, Title: "Invalid query", Detail: "correlation_key is required"})
		return
	}
	var require bool
	if v := q.Get("require_match"); v != "" {
		var err error
		if require, err = strconv.ParseBool(v); err != nil {
			writeProblem(w, problem{Status: http.StatusBadRequest, Code: codeInvalidQuery, Title: "Invalid query", Detail: "require_match is true or false"})
			return
		}
	}
	h.signal(w, r, engine.SignalParams{Tenant: tenant, CorrelationKey: key, RequireMatch: require})
}

// signal delivers the request's signal: its name from the path, its event
// id from Idempotency-Key, its payload from the body. 202 for a new
// signal, queued or delivered; 200 with Idempotent-Replayed for a
// redelivery of the same event.
func (h *Handler) signal(w http.ResponseWriter, r *http.Request, p engine.SignalParams) {
	eventID, err := parseIdempotencyKey(r.Header.Values("Idempotency-Key"))
	if err != nil {
		code := codeInvalidKey
		if errors.Is(err, errMissingKey) {
			code = codeMissingKey
		}
		writeProblem(w, problem{Status: http.StatusBadRequest, Code: code, Title: "Idempotency-Key (the event's id) missing or invalid", Detail: err.Error()})
		return
	}
	body, ok := h.readJSON(w, r)
	if !ok {
		return
	}
	p.Name, p.EventID, p.Payload = r.PathValue("name"), eventID, body
	res, err := h.engine.Signal(r.Context(), p)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	status := http.StatusAccepted
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
		status = http.StatusOK
	}
	if res.RunID != "" {
		w.Header().Set("Location", h.runPath(res.RunID))
	}
	writeJSON(w, status, signalResource{
		ID: res.ID, Name: p.Name, EventID: eventID, RunID: res.RunID, CorrelationKey: p.CorrelationKey, Delivered: res.Delivered,
	})
}
