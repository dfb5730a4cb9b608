package engine

import (
	"fmt"
	"sort"
	"strconv"
	"sync"
)

// Workflows is a registry of workflow definitions, handed to a Client
// through Config. Register every workflow before creating the client. A
// name may have several versions (WorkflowOpts.Version): runs execute with
// the version they started with, and new runs start on the newest version
// that does not drain.
type Workflows struct {
	mu   sync.RWMutex
	defs map[string]map[int]definition
}

// NewWorkflows returns an empty registry.
func NewWorkflows() *Workflows {
	return &Workflows{defs: make(map[string]map[int]definition)}
}

func (r *Workflows) add(def definition) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	versions := r.defs[def.Name()]
	if versions == nil {
		versions = map[int]definition{}
		r.defs[def.Name()] = versions
	}
	if _, dup := versions[def.version()]; dup {
		return fmt.Errorf("engine: workflow %q version %d registered twice", def.Name(), def.version())
	}
	versions[def.version()] = def
	return nil
}

// lookup returns the version of workflow name that new runs start on: the
// newest that does not drain.
func (r *Workflows) lookup(name string) (definition, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	versions, ok := r.defs[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownWorkflow, name)
	}
	var start definition
	for _, def := range versions {
		if !def.draining() && (start == nil || def.version() > start.version()) {
			start = def
		}
	}
	if start == nil {
		return nil, fmt.Errorf("%w: every registered version of %q drains: none takes new runs", ErrUnknownWorkflow, name)
	}
	return start, nil
}

// lookupVersion returns version ver of workflow name, which the runs that
// started on it execute with.
func (r *Workflows) lookupVersion(name string, ver int) (definition, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	def, ok := r.defs[name][ver]
	if !ok {
		return nil, fmt.Errorf("%w: %s is not registered here", ErrUnknownWorkflow, served(name, ver))
	}
	return def, nil
}

// all returns every registered definition.
func (r *Workflows) all() []definition {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []definition
	for _, versions := range r.defs {
		for _, def := range versions {
			out = append(out, def)
		}
	}
	return out
}

// Has reports whether a workflow named name is registered, in any version.
func (r *Workflows) Has(name string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.defs[name]) > 0
}

// Names returns the registered workflow names in order.
func (r *Workflows) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.defs))
	for n := range r.defs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Served returns every registered version as "name@version", in order:
// what a process that executes runs with this registry serves.
func (r *Workflows) Served() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []string
	for name, versions := range r.defs {
		for ver := range versions {
			out = append(out, served(name, ver))
		}
	}
	sort.Strings(out)
	return out
}

// served names a workflow version as processes announce it. Workflow names
// hold no '@'.
func served(name string, ver int) string { return name + "@" + strconv.Itoa(ver) }
