// Package api serves Ratchet over HTTP: an http.Handler, to mount in the
// user's own server, that implements the Idempotency-Key contract of
// docs/api.md over the engine — start or attach to a run, replay a finished
// one byte for byte, inspect, list, cancel and resume runs.
//
// The handler maps engine outcomes and errors to statuses through one
// table (problems.go); the engine knows nothing of HTTP. Errors are
// application/problem+json (RFC 9457) with a stable code.
//
// It imports engine (and migrations, for readiness) and must never import
// worker, recovery or cmd.
package api
