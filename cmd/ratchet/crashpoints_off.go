//go:build !crashpoints

package main

import "github.com/ratchet-run/ratchet/engine"

// crashHooks is nil in the ordinary build; see crashpoints_on.go.
func crashHooks() engine.Hooks { return nil }
