package worker_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/worker"
)

// A run killed mid-way in one process and resumed by another: the resumed
// execution's spans are linked to the trace of the request that created it.
func TestResumedRunInAnotherProcessLinksToTheRequestTrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	victim := startProc(t, b.env("STALE_AFTER=1s", "INSERT_ONLY=1", "PAUSE_AT=charged.after-commit", "RUN_KEY=traced",
		"TRACEPARENT=00-"+traceID+"-00f067aa0ba902b7-01")...)
	victim.Expect("AT charged.after-commit traced")
	victim.Signal(syscall.SIGKILL)
	victim.Wait()

	spans := tracetest.NewSpanRecorder()
	workflows := engine.NewWorkflows()
	require.NoError(t, addOrderFlow(workflows, b.gwURL, &pauser{}))
	// The victim's 1 s lease is what the worker waits out; the worker's
	// own is long, so that one execution of it finishes the run.
	startWorker(t, b, workflows, &worker.Config{Engine: engine.Config{
		StaleAfter: 30 * time.Second, TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
	}})
	b.awaitFinished(t, 30*time.Second, "traced")

	var run sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, s := range spans.Ended() {
			if s.Name() == "ratchet.run order" {
				run = s
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	require.NotEqual(t, traceID, run.SpanContext().TraceID().String(), "the resumed execution runs in the worker's trace")
	var linked bool
	for _, l := range run.Links() {
		linked = linked || l.SpanContext.TraceID().String() == traceID
	}
	require.True(t, linked, "and links to the request's: %+v", run.Links())
	require.False(t, run.Parent().IsValid(), "a root span: the run was found in the runs table, not handed over by a job")
	b.requireExactlyOnce(t, "traced")
}
