package engine

import "context"

// Hooks observe execution at run and phase boundaries; the observability
// layer implements them with spans and metrics. Each method returns the
// context the observed work runs in and a function the engine calls exactly
// once when that work ends. Implementations must be safe for concurrent use
// and should not block.
type Hooks interface {
	// Run is called when an executor begins executing a run (created,
	// resumed or taken over).
	Run(ctx context.Context, info RunInfo) (context.Context, func(RunEnd))
	// Phase is called when a workflow reaches a phase, including one that
	// is replayed from the journal.
	Phase(ctx context.Context, info PhaseInfo) (context.Context, func(error))
}

// RunInfo describes an execution of a run as it begins.
type RunInfo struct {
	RunID         string
	Tenant        string
	Workflow      string
	Version       int
	Attempt       int
	LeaseToken    int64
	RecoveryPoint string
	// Traceparent of the request that created the run, if any.
	Traceparent string
	// Resumed is true when the run is continuing: an earlier execution
	// claimed it, or committed phases exist.
	Resumed bool
}

// RunEnd describes how an execution ended. Status is the run's status
// afterwards (unfinished statuses when the run will be retried or resumed);
// Err is the workflow's error or the reason execution stopped.
type RunEnd struct {
	Status Status
	Err    error
}

// PhaseInfo describes a phase as it begins.
type PhaseInfo struct {
	RunID      string
	Workflow   string
	Name       string
	Kind       PhaseKind
	Seq        int
	LeaseToken int64
	Attempt    int
	// Replayed is true when the phase is answered from the journal.
	Replayed bool
	// ChildKey is the derived idempotency key of an external step.
	ChildKey string
}
