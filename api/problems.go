package api

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ratchet-run/ratchet/engine"
)

// problem is an RFC 9457 problem details object.
type problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Code     string `json:"code"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	RunID    string `json:"run_id,omitempty"`
	// Compensated lists, for a compensated run, the phases undone.
	Compensated []string `json:"compensated,omitempty"`
}

// Problem codes of the API's own checks.
const (
	codeUnauthorized     = "unauthorized"
	codeMissingKey       = "missing_idempotency_key"
	codeInvalidKey       = "invalid_idempotency_key"
	codeMalformedJSON    = "malformed_json"
	codeBodyTooLarge     = "body_too_large"
	codeUnsupportedMedia = "unsupported_media_type"
	codeInvalidQuery     = "invalid_query"
	codeInvalidValue     = "invalid_value"
	codeConflict         = "conflict"
	codeUnavailable      = "unavailable"
	codeInternal         = "internal"
	codeRunCancelled     = "run_cancelled"
	codeInProgress       = "run_in_progress"
)

// errorStatuses is the one table from engine errors to HTTP.
var errorStatuses = []struct {
	err    error
	status int
	code   string
	title  string
}{
	{engine.ErrUnknownWorkflow, http.StatusNotFound, "unknown_workflow", "No such workflow"},
	{engine.ErrInvalidKey, http.StatusBadRequest, codeInvalidKey, "Invalid Idempotency-Key"},
	{engine.ErrInvalidInput, http.StatusBadRequest, "invalid_input", "The input does not fit the workflow"},
	{engine.ErrUnknownQueue, http.StatusBadRequest, "unknown_queue", "No such queue"},
	{engine.ErrInvalidSchedule, http.StatusBadRequest, "invalid_schedule", "The schedule is not valid"},
	{engine.ErrScheduleNotFound, http.StatusNotFound, "schedule_not_found", "No such schedule"},
	{engine.ErrFingerprintMismatch, http.StatusUnprocessableEntity, "idempotency_key_reused", "Idempotency-Key already used for a different request"},
	{engine.ErrLeaseHeld, http.StatusConflict, codeInProgress, "The run is in progress"},
	{engine.ErrRunNotFound, http.StatusNotFound, "run_not_found", "No such run"},
	{engine.ErrFinished, http.StatusConflict, "run_finished", "The run has already finished"},
	{engine.ErrNotFailed, http.StatusConflict, "run_not_failed", "Only a failed run, or one parked for an operator, can be resumed"},
	{engine.ErrPastPivot, http.StatusConflict, "past_pivot", "The run is past its pivot: it is carried through, not cancelled"},
	{engine.ErrShutdown, http.StatusServiceUnavailable, "shutting_down", "The server is shutting down"},
	{engine.ErrInvalidListParams, http.StatusBadRequest, codeInvalidQuery, "Invalid query"},
	{engine.ErrInvalidSignal, http.StatusBadRequest, "invalid_signal", "Invalid signal"},
	{engine.ErrSignalMismatch, http.StatusUnprocessableEntity, "event_id_reused", "This event id was already sent with another signal"},
	{engine.ErrNoMatch, http.StatusNotFound, "no_matching_run", "No run awaits this signal"},
}

// problemFor maps an error to its problem. Serialization failures, deadlocks
// and unique violations are conflicts the client may retry, never a 5xx; a
// value Postgres refuses is the client's (400); a database that is gone,
// restarting, refusing connections or read-only is unavailable (503), not
// broken.
func problemFor(err error) problem {
	for _, e := range errorStatuses {
		if errors.Is(err, e.err) {
			return problem{Status: e.status, Code: e.code, Title: e.title, Detail: err.Error()}
		}
	}
	unavailable := problem{Status: http.StatusServiceUnavailable, Code: codeUnavailable, Title: "The database is unreachable; retry later"}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch code := pgErr.Code; {
		case code == pgerrcode.SerializationFailure, code == pgerrcode.DeadlockDetected,
			code == pgerrcode.UniqueViolation, code == pgerrcode.LockNotAvailable:
			return problem{Status: http.StatusConflict, Code: codeConflict, Title: "Concurrent update; retry the request"}
		case pgerrcode.IsDataException(code):
			return problem{Status: http.StatusBadRequest, Code: codeInvalidValue, Title: "A value the database cannot store", Detail: pgErr.Message}
		case pgerrcode.IsConnectionException(code), pgerrcode.IsOperatorIntervention(code) && code != pgerrcode.QueryCanceled:
			return unavailable // 08xxx; 57P01–57P03 (shutdown, crash, starting up)
		case code == pgerrcode.ReadOnlySQLTransaction:
			// A standby answered: a failover is under way, or the pool
			// reached a server that is no longer the primary (the service
			// closes such a connection, so the retry gets a fresh one).
			return problem{Status: http.StatusServiceUnavailable, Code: codeUnavailable,
				Title: "The database is read-only (a failover is under way); retry later"}
		}
	}
	// A connection that broke under a statement — the server shut down or
	// vanished mid-answer, as in a failover — leaves the statement's
	// outcome unknown: still the database's unavailability, which the
	// client's retry with its key resolves.
	var connErr *pgconn.ConnectError
	var netErr *net.OpError
	if errors.As(err, &connErr) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &netErr) {
		return unavailable
	}
	return problem{Status: http.StatusInternalServerError, Code: codeInternal, Title: "Internal error"}
}

// writeProblem sends p. 5xx details stay in the log, never in the response.
// Every 409 and 503 says when to try again; a second unless the caller set
// Retry-After already.
func writeProblem(w http.ResponseWriter, p problem) {
	if p.Status >= 500 {
		p.Detail = ""
	}
	if (p.Status == http.StatusConflict || p.Status == http.StatusServiceUnavailable) && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
	p.Type = "urn:ratchet:problem:" + p.Code
	body, _ := json.Marshal(p)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	w.Write(body) //nolint:errcheck // the client may be gone
}
