// Package crashpoint lets the test kit (engine/enginetest) end an execution
// as a killed process would, right after a named phase commits: the engine
// writes nothing more for it and leaves its lease to expire. It lives here
// so that the engine's public surface carries no testing hook.
package crashpoint

import (
	"context"
	"errors"
)

// ErrCrashed is the cause with which an execution is ended at its crash
// point, and the error the crashed call returns.
var ErrCrashed = errors.New("execution crashed at a test crash point")

type key struct{}

// After returns a context whose executions crash right after committing
// the phase called phase (replayed phases do not count).
func After(ctx context.Context, phase string) context.Context {
	return context.WithValue(ctx, key{}, phase)
}

// Hit reports whether ctx asks to crash after committing phase.
func Hit(ctx context.Context, phase string) bool {
	p, ok := ctx.Value(key{}).(string)
	return ok && p == phase
}
