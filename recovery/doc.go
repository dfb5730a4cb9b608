// Package recovery finishes runs that nobody is executing. A Recoverer, one
// in every process that should resume runs, polls the runs table for due
// runs (engine.Client.ClaimDue: a lease expired, a backoff over, a run
// created unleased or handed over), takes them over with new lease tokens
// and executes them from their recovery points. Processes share the work
// through the database alone: no leader, no job per run, nothing that can
// die with a process and delay another. Prune applies the retention
// classes to finished runs.
//
// Only the database's clock decides what is due. The package imports
// engine and must never import worker, api or cmd.
package recovery
