// Package steps holds what an external step needs to be the same call on
// every retry: derived child idempotency keys, a retry policy, the
// classification of failures into permanent, retryable and indeterminate,
// and an HTTP transport that sends the key and the trace context.
//
// It is a leaf: it must never import engine or any other Ratchet package.
// The engine calls it; users may call it directly from their step functions.
package steps
