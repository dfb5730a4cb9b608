package api

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/ratchet-run/ratchet/engine"
)

// runResource is a run as the API shows it. It is rendered from stored
// columns only, none of which change once a run has finished: so a finished
// run renders to the same bytes every time, which is what makes replays
// byte-identical.
type runResource struct {
	ID              string        `json:"id"`
	Workflow        string        `json:"workflow"`
	WorkflowVersion int           `json:"workflow_version"`
	IdempotencyKey  string        `json:"idempotency_key"`
	Status          engine.Status `json:"status"`
	RecoveryPoint   string        `json:"recovery_point"`
	// Attempt counts the run's executions, wakes included; Failures
	// those that failed or were lost since its creation or last reopen,
	// which its retry policy bounds.
	Attempt           int              `json:"attempt"`
	Failures          int              `json:"failures"`
	Input             json.RawMessage  `json:"input,omitempty"`
	Output            json.RawMessage  `json:"output,omitempty"`
	Error             *engine.RunError `json:"error,omitempty"`
	Lease             *leaseResource   `json:"lease,omitempty"`
	NextAttemptAt     *time.Time       `json:"next_attempt_at,omitempty"`
	CancelRequestedAt *time.Time       `json:"cancel_requested_at,omitempty"`
	// WaitingFor is what an unfinished run is parked for: the phase, and
	// until when.
	WaitingFor *waitResource `json:"waiting_for,omitempty"`
	// Blocked says what an unfinished run waits for and what will move
	// it (engine.Blocked).
	Blocked *engine.Blocked `json:"blocked,omitempty"`
	// Concurrency is the key whose slots the run executes in, and whether
	// it holds one now (engine.Concurrency).
	Concurrency *concurrencyResource `json:"concurrency,omitempty"`
	// Queue is the queue the run waits in or started from, its priority
	// there and when it started (engine.Queue).
	Queue *queueResource `json:"queue,omitempty"`
	// ParentRunID is the run that started this one as its child;
	// Children the runs this one started (GET /v1/runs/{id} only).
	ParentRunID *string         `json:"parent_run_id,omitempty"`
	Children    []childResource `json:"children,omitempty"`
	// ErrorStreak counts the retryable failures in a row with the same
	// error.
	ErrorStreak int `json:"error_streak,omitempty"`
	// Pivot is the run's pivot phase, once committed.
	Pivot      *string         `json:"pivot,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	UpdatedAt  time.Time       `json:"updated_at"`
	FinishedAt *time.Time      `json:"finished_at,omitempty"`
	ExpiresAt  *time.Time      `json:"expires_at,omitempty"`
	Phases     []phaseResource `json:"phases,omitempty"`
}

type concurrencyResource struct {
	Key   string `json:"key"`
	Limit int    `json:"limit"`
	// HoldsSlot is false once the run has finished.
	HoldsSlot bool `json:"holds_slot"`
}

type childResource struct {
	ID       string        `json:"id"`
	Workflow string        `json:"workflow"`
	Status   engine.Status `json:"status"`
}

type queueResource struct {
	Name     string `json:"name"`
	Priority int    `json:"priority"`
	// StartedAt is when the run left the queue; absent while it waits.
	StartedAt *time.Time `json:"started_at,omitempty"`
}

type waitResource struct {
	Kind  engine.PhaseKind `json:"kind"`
	Phase string           `json:"phase"`
	Until *time.Time       `json:"until,omitempty"`
	// Key is the concurrency key a queued run waits for a slot of.
	Key string `json:"key,omitempty"`
	// Queue is the queue a run waits in before it starts.
	Queue string `json:"queue,omitempty"`
	// Child is the child run an await_child phase waits for.
	Child string `json:"child,omitempty"`
	// What a run parked for an operator needs (engine.Wait).
	Reason       string           `json:"reason,omitempty"`
	Error        *engine.RunError `json:"error,omitempty"`
	ChildKey     string           `json:"child_key,omitempty"`
	FirstAttempt *time.Time       `json:"first_attempt,omitempty"`
	// KeyWindow is in seconds.
	KeyWindow float64 `json:"key_window,omitempty"`
	Resolved  bool    `json:"resolved,omitempty"`
}

type leaseResource struct {
	Owner     string     `json:"owner,omitempty"`
	Token     int64      `json:"token"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

type phaseResource struct {
	Seq        int              `json:"seq"`
	Name       string           `json:"name"`
	Kind       engine.PhaseKind `json:"kind"`
	Status     string           `json:"status"`
	ChildKey   *string          `json:"child_key,omitempty"`
	Attempts   int              `json:"attempts"`
	Output     json.RawMessage  `json:"output,omitempty"`
	Error      *engine.RunError `json:"error,omitempty"`
	StartedAt  time.Time        `json:"started_at"`
	FinishedAt time.Time        `json:"finished_at"`
	// Compensable says that the phase registered an undo.
	Compensable bool `json:"compensable,omitempty"`
	// Execution is the run's attempt that committed the phase; Replayed
	// says that a later execution replayed it from the journal.
	Execution int  `json:"execution,omitempty"`
	Replayed  bool `json:"replayed"`
}

func newRunResource(r *engine.Run, phases []engine.Phase) runResource {
	res := runResource{
		ID: r.ID, Workflow: r.Workflow, WorkflowVersion: r.WorkflowVersion, IdempotencyKey: r.IdempotencyKey,
		Status: r.Status, RecoveryPoint: r.RecoveryPoint, Attempt: r.Attempt, Failures: r.Failures, Output: r.Output, Error: r.Error,
		NextAttemptAt: r.NextAttemptAt, CancelRequestedAt: r.CancelRequestedAt, Pivot: r.Pivot, Blocked: r.Blocked,
		CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(), FinishedAt: utc(r.FinishedAt), ExpiresAt: utc(r.ExpiresAt),
	}
	if !r.Status.Finished() {
		res.ErrorStreak = r.ErrorStreak
	}
	if w := r.WaitingFor; w != nil && !r.Status.Finished() {
		res.WaitingFor = &waitResource{Kind: w.Kind, Phase: w.Phase, Until: utc(w.Until), Key: w.Key, Queue: w.Queue, Child: w.Child, Reason: w.Reason, Error: w.Error,
			ChildKey: w.ChildKey, FirstAttempt: utc(w.FirstAttempt), KeyWindow: w.KeyWindow.Seconds(), Resolved: w.Resolved}
	}
	if r.ConcurrencyKey != nil && r.ConcurrencyLimit != nil {
		res.Concurrency = &concurrencyResource{Key: *r.ConcurrencyKey, Limit: *r.ConcurrencyLimit, HoldsSlot: r.HoldsSlot}
	}
	res.ParentRunID = r.ParentRunID
	if r.Queue != nil {
		res.Queue = &queueResource{Name: *r.Queue, Priority: r.Priority, StartedAt: utc(r.QueueStartedAt)}
	}
	if r.LeaseExpiresAt != nil {
		res.Lease = &leaseResource{Token: r.LeaseToken, ExpiresAt: utc(r.LeaseExpiresAt)}
		if r.LeaseOwner != nil {
			res.Lease.Owner = *r.LeaseOwner
		}
	}
	for _, p := range phases {
		status := "committed"
		if p.Error != nil {
			status = "failed"
		}
		res.Phases = append(res.Phases, phaseResource{
			Seq: p.Seq, Name: p.Name, Kind: p.Kind, Status: status, ChildKey: p.ChildKey, Attempts: p.Attempts,
			Output: p.Output, Error: p.Error, StartedAt: p.StartedAt.UTC(), FinishedAt: p.FinishedAt.UTC(), Compensable: p.Compensable,
			Execution: p.Execution, Replayed: p.Execution > 0 && r.Attempt > p.Execution,
		})
	}
	return res
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, problem{Status: http.StatusInternalServerError, Code: codeInternal, Title: "Internal error"})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // the client may be gone
}

// finalResponse renders a finished run as its start request's response:
// the stored status with the run (success) or a problem (failure).
func finalResponse(r *engine.Run, instance string) (status int, contentType string, body []byte) {
	status = http.StatusConflict
	if r.ResponseStatus != nil {
		status = *r.ResponseStatus
	}
	if r.Status == engine.StatusSucceeded {
		body, _ = json.Marshal(newRunResource(r, nil))
		return status, "application/json", body
	}
	p := problem{Status: status, RunID: r.ID, Instance: instance}
	switch {
	case r.Status == engine.StatusCompensated:
		var rec engine.Compensation
		_ = json.Unmarshal(r.Output, &rec)
		p.Compensated = rec.Compensated
		p.Code, p.Title = codeRunCancelled, "The run was cancelled and what it did was undone"
		if r.Error != nil && r.Error.Code != engine.CodeCancelled {
			p.Code, p.Title, p.Detail = r.Error.Code, "The run failed and what it did was undone", r.Error.Message
		}
	case r.Status == engine.StatusCancelled:
		p.Code, p.Title = codeRunCancelled, "The run was cancelled"
	case r.Error != nil:
		p.Code, p.Title, p.Detail = r.Error.Code, "The run failed", r.Error.Message
	default:
		p.Code, p.Title = "run_failed", "The run failed"
	}
	p.Type = "urn:ratchet:problem:" + p.Code
	body, _ = json.Marshal(p)
	return status, "application/problem+json", body
}
