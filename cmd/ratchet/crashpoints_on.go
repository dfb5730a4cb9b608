//go:build crashpoints

package main

import (
	"context"
	"os"
	"syscall"

	"github.com/ratchet-run/ratchet/engine"
)

// crashHooks, in a binary built with -tags crashpoints, kill the process
// abruptly (SIGKILL to itself: no deferred code, no graceful anything) at
// the phase boundary named by RATCHET_CRASH_AT: "start:<phase>" as a phase
// begins, "end:<phase>" once it has committed. Crash tests use it; the
// ordinary build has no such code.
func crashHooks() engine.Hooks {
	at := os.Getenv("RATCHET_CRASH_AT")
	if at == "" {
		return nil
	}
	return crashAt(at)
}

type crashAt string

func (c crashAt) Run(ctx context.Context, _ engine.RunInfo) (context.Context, func(engine.RunEnd)) {
	return ctx, func(engine.RunEnd) {}
}

func (c crashAt) Phase(ctx context.Context, info engine.PhaseInfo) (context.Context, func(error)) {
	if !info.Replayed && string(c) == "start:"+info.Name {
		die()
	}
	return ctx, func(err error) {
		if err == nil && !info.Replayed && string(c) == "end:"+info.Name {
			die()
		}
	}
}

func die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}
