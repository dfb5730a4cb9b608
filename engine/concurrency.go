package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/metric"
)

// Concurrency limits how many runs of one key execute at once
// (WorkflowOpts.Concurrency): one customer's refunds one at a time, say,
// or a workflow's runs a hundred at a time (an empty Key).
//
// A run over its key's limit is created and queued, never refused: it is
// pending with blocked reason "concurrency" until a slot passes to it.
// Runs of one key take slots in creation order. A slot is held by the run
// itself, not counted beside it: the run gives it up in the statement that
// finishes it (or parks it, with ReleaseWhileParked), and one whose
// executor died keeps it only until it is resumed, at stale_after, and
// finishes — so no slot can leak, and none is given to a second run while
// the first may still be executing (docs/concurrency.md).
type Concurrency struct {
	// Key is the input field whose value keys the run: a name, or a
	// dotted path of names ("customer.id"), whose value is a string or a
	// number. Empty: every run of the group shares one key. A start may
	// name the value itself (StartParams.ConcurrencyKey).
	Key string
	// Limit is how many runs of one key may hold a slot at once: 1 or
	// more.
	Limit int
	// Group names the keys' namespace: runs of workflows with the same
	// group and key value share the key's slots. Defaults to the
	// workflow's name.
	Group string
	// ReleaseWhileParked gives a run's slot up while it is parked
	// (sleeping, awaiting a signal, or waiting for an operator), for the
	// next run of its key; when it wakes, it queues for a slot again, in
	// its creation order. By default a parked run keeps its slot.
	ReleaseWhileParked bool
}

// validate reports whether the declaration can key runs.
func (c *Concurrency) validate() error {
	if c.Limit < 1 {
		return fmt.Errorf("concurrency limit %d: want 1 or more", c.Limit)
	}
	if c.Group != "" && !validName(c.Group) {
		return fmt.Errorf("concurrency group %q: want 1..255 letters, digits, '.', '-' or '_'", c.Group)
	}
	if c.Key != "" {
		for _, name := range strings.Split(c.Key, ".") {
			if name == "" {
				return fmt.Errorf("concurrency key %q: want a field name or a dotted path of names", c.Key)
			}
		}
	}
	return nil
}

// maxConcurrencyValue bounds a key's value, as an idempotency key's.
const maxConcurrencyValue = 255

// runKey is the concurrency key and limit a run is created with, from the
// workflow's declaration and the start's overrides; nil without a
// declaration or an override.
func runKey(decl *Concurrency, name string, input []byte, p StartParams) (key *string, limit *int, err error) {
	if decl == nil && p.ConcurrencyKey == "" && p.ConcurrencyLimit == 0 {
		return nil, nil, nil
	}
	d := Concurrency{Group: name}
	if decl != nil {
		d = *decl
		if d.Group == "" {
			d.Group = name
		}
	}
	if p.ConcurrencyLimit != 0 {
		d.Limit = p.ConcurrencyLimit
	}
	if d.Limit < 1 {
		return nil, nil, fmt.Errorf("%w for workflow %q: concurrency limit %d: want 1 or more", ErrInvalidInput, name, d.Limit)
	}
	value := p.ConcurrencyKey
	if value == "" && d.Key != "" {
		if value, err = keyField(input, d.Key); err != nil {
			return nil, nil, fmt.Errorf("%w for workflow %q: concurrency key: %v", ErrInvalidInput, name, err)
		}
	}
	if err := checkKeyValue(value); err != nil {
		return nil, nil, fmt.Errorf("%w for workflow %q: concurrency key: %v", ErrInvalidInput, name, err)
	}
	k := d.Group
	if value != "" {
		k += "/" + value
	}
	return &k, &d.Limit, nil
}

func checkKeyValue(v string) error {
	if len(v) > maxConcurrencyValue {
		return fmt.Errorf("%d bytes is more than %d", len(v), maxConcurrencyValue)
	}
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%q holds a control character", v)
		}
	}
	return nil
}

// keyField reads the value at the dotted path in a JSON input: a string,
// or a number as written.
func keyField(input []byte, path string) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	for _, name := range strings.Split(path, ".") {
		obj, ok := v.(map[string]any)
		if !ok {
			return "", fmt.Errorf("field %q: the input has no object there", path)
		}
		if v, ok = obj[name]; !ok {
			return "", fmt.Errorf("field %q is missing from the input", path)
		}
	}
	switch v := v.(type) {
	case string:
		if v == "" {
			return "", fmt.Errorf("field %q is empty", path)
		}
		return v, nil
	case json.Number:
		return v.String(), nil
	}
	return "", fmt.Errorf("field %q is not a string or a number", path)
}

// needsSlot reports whether the run must take a slot before anything of it
// executes.
func (r *Run) needsSlot() bool {
	return r.ConcurrencyKey != nil && !r.HoldsSlot
}

// queued reports whether the run is parked for a slot of its key.
func (r *Run) queued() bool {
	return r.WaitingFor != nil && r.WaitingFor.Kind == KindConcurrency
}

const takeSlotSQL = `SELECT ` + runColumns + ` FROM ratchet.take_slot($1, $2)`

// takeSlot takes a slot of the run's key for the execution that claimed
// it, or queues the run (its lease released: the execution ends). It
// returns the run as it then is, with the claim's send time kept.
func (c *Client) takeSlot(ctx context.Context, run *Run) (*Run, error) {
	taken, ok, err := queryRun(ctx, c.pool, takeSlotSQL, run.ID, run.LeaseToken)
	if err != nil {
		return nil, fmt.Errorf("engine: run %s: take a concurrency slot: %w", run.ID, err)
	}
	if !ok {
		return nil, fmt.Errorf("engine: run %s: %w", run.ID, ErrLeaseLost)
	}
	if taken.HoldsSlot {
		taken.claimSent = run.claimSent
		return taken, nil
	}
	c.tel.queued.Add(ctx, 1, metric.WithAttributes(attrWorkflow.String(run.Workflow)))
	return taken, nil
}

// PassFreeSlots passes every concurrency key's free slots to its oldest
// queued runs and returns how many it woke. A slot given up passes at
// once, in the statement that gives it up; this is for those no pass
// reached — the limit was raised, or a run a slot passed to was cancelled
// before it took it. Workers call it every few polls.
func (c *Client) PassFreeSlots(ctx context.Context) (int, error) {
	var n int
	if err := c.pool.QueryRow(ctx, `SELECT ratchet.pass_free_slots()`).Scan(&n); err != nil {
		return 0, fmt.Errorf("engine: pass free slots: %w", notMigrated(err))
	}
	return n, nil
}

// gaveUpSlot rings Ready if the execution's run held a slot (it passed
// to the key's oldest queued run, which is due now) or started from a
// queue (its room there is free).
func (ex *execution) gaveUpSlot() {
	if ex.run.HoldsSlot || ex.run.Queue != nil {
		ex.c.ring()
	}
}
