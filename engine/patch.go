package engine

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"
)

// patchPrefix names the marker phase Patched journals: "patch:<id>".
const patchPrefix = "patch:"

// Patched reports whether the run executing in ctx takes the patched path
// id, for a small change inside one workflow version (docs/versioning.md):
//
//	if engine.Patched(ctx, "fee-in-cents") {
//		// the new code
//	} else {
//		// the old code, for runs that passed this point before the patch
//	}
//
// A run whose journal already holds phases past this point without the
// patch's marker started before the patch was deployed: Patched is false,
// on every replay. A run that reaches this point past its journal takes
// the patch: Patched journals a marker phase ("patch:<id>", kind
// KindPatch, one statement) and is true, on every replay too. The answer
// is fixed for the rest of the execution, so a patch may be checked in
// several places. Once no run in flight can take the old path (ratchet
// check-deploy tells), remove the else branch — and keep the call, or the
// marker in the journals of runs in flight would no longer match.
//
// Outside a run, Patched is true.
func Patched(ctx context.Context, id string) bool {
	ex, err := executionFrom(ctx)
	if err != nil {
		return true
	}
	name := patchPrefix + id
	ex.mu.Lock()
	if taken, decided := ex.patches[id]; decided {
		ex.mu.Unlock()
		return taken
	}
	switch {
	case ex.inPhase:
		ex.fatal = &phaseUsageError{code: CodeInvalidPhase, msg: fmt.Sprintf("Patched(%q) called inside a phase: call it from the workflow, between phases", id)}
		ex.mu.Unlock()
		return true
	case id == "" || !utf8.ValidString(id) || utf8.RuneCountInString(name) > 255:
		ex.fatal = &phaseUsageError{code: CodeInvalidPhase, msg: fmt.Sprintf("patch id %q: want 1..%d characters of UTF-8", id, 255-len(patchPrefix))}
		ex.mu.Unlock()
		return true
	}
	seq := ex.next
	if seq < len(ex.journal) {
		taken := ex.journal[seq].Name == name
		if taken {
			ex.next++
			ex.used[name] = true
		}
		ex.patches[id] = taken
		ex.mu.Unlock()
		return taken
	}
	ex.patches[id] = true
	// Past the journal: the run takes the patch. Nothing is written when
	// the execution goes no further forward (its next phase will stop it).
	quiet := ex.dry || ex.compensating || ex.cancelled || ex.parked != nil || ex.fatal != nil || ex.broken != nil
	ex.mu.Unlock()
	if quiet {
		ex.markDryEnd()
		return true
	}
	ctx, end := ex.hooks.Phase(ctx, ex.phaseInfo(name, KindPatch, seq, false, ""))
	cancel, err := ex.commitPhase(ctx, nil, phaseRecord{seq: seq, name: name, kind: KindPatch, output: []byte("null"), attempts: 1})
	end(err)
	if err == nil {
		ex.committed(name, cancel)
	}
	// A failed commit has broken the execution (or found it superseded or
	// cancelled): its next phase returns why, so the patched path commits
	// nothing before a fresh execution reads the journal again.
	return true
}

func isPatchMarker(name string) bool { return strings.HasPrefix(name, patchPrefix) }
