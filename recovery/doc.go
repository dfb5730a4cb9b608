// Package recovery is the policy that finishes runs whose executor died:
// when a run scheduled for a look is due, Decide says whether it is done
// with, must wait (its lease is live, or its retry is not due), or may be
// taken over; Recoverer acts on that with the engine. Prune applies the
// retention classes to finished runs.
//
// Only the database's clock is used. The package knows nothing of how looks
// are scheduled: the worker package drives it from River jobs. It imports
// engine and must never import worker, api or cmd.
package recovery
