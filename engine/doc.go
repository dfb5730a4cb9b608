// Package engine runs durable workflows on Postgres.
//
// A workflow is ordinary Go code registered under a name. Starting it with an
// idempotency key creates a run, claimed with a single INSERT before any side
// effect, so one key yields one run however many callers race. The run is a
// sequence of phases; each phase commits in its own transaction and moves the
// run's recovery point forward. A phase commit is a compare-and-set on the
// run's lease token, so an executor that has been superseded (a "zombie")
// cannot advance the run. Resuming a run replays committed phases from the
// journal without running them and continues from the recovery point.
//
// Invariants this package keeps:
//
//   - A (tenant, idempotency key) pair maps to at most one run.
//   - Every write to a run after its claim is fenced by the lease token.
//   - A phase's own writes, its journal row and the move of the recovery
//     point commit together or not at all.
//   - Lease times are compared with Postgres's clock only; an executor's
//     own clock only makes it stop sooner (when its heartbeats go
//     unconfirmed for most of its lease).
//   - A run is finished only by an explicit success, a permanent error or a
//     cancellation; any other failure leaves it resumable.
//
// The engine knows nothing of HTTP or of River: the api package maps its
// outcomes and errors to statuses, and the worker package resumes runs.
// It must never import api, worker, recovery or cmd.
package engine
