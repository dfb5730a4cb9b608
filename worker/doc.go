// Package worker is one process's background work: a recovery.Recoverer
// that finds due runs in the runs table and executes them (crashed,
// released for a retry, created unleased, handed over), and a River client
// that prunes expired runs (on River's elected leader) and works the
// application's own jobs, such as an outbox's deliveries. Every worker
// process finds due runs by itself; none waits for a leader or for a job
// that died with another process.
//
// A Worker also owns its process's engine client, so that Stop can let
// executions finish, or hand their runs over, before the process exits.
//
// It imports engine, recovery and River, and must never import api or cmd.
package worker
