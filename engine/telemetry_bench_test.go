package engine

import (
	"context"
	"testing"
)

// BenchmarkTelemetryNoop is the cost the instrumentation adds to a phase
// when no OpenTelemetry provider is installed (the default): compare it to
// a phase commit's milliseconds.
func BenchmarkTelemetryNoop(b *testing.B) {
	tel, err := newTelemetry(nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	info := PhaseInfo{RunID: "01JD3M5ZQ6V1YQ2W3E4R5T6Y7U", Workflow: "payment", Name: "charge_created", Kind: KindStep, LeaseToken: 1, Attempt: 1, ChildKey: "rk1_zx34ejctq23fa3zbukvmdgv3xvxapfor"}
	for b.Loop() {
		_, end := tel.Phase(ctx, info)
		end(nil)
	}
}
