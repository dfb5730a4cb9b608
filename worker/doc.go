// Package worker runs Ratchet's background work on River: it resumes runs
// whose executor died (a "resume" job per claim, scheduled at the lease's
// expiry), retries runs at their next_attempt_at, sweeps up runs that have
// no job, and prunes expired runs. Several worker processes may share one
// database; the sweep and the pruning run on River's elected leader only.
//
// A Worker also owns the engine client of its process, so that every claim
// the process makes schedules its River job in the claiming transaction.
//
// It imports engine, recovery and River, and must never import api or cmd.
package worker
