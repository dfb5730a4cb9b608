package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultSignalRetention is how long an unconsumed signal is kept.
const DefaultSignalRetention = 7 * 24 * time.Hour

// SignalParams describe a signal: its name, its own idempotency key, its
// payload, and one address — a run (by id, or by the idempotency key it
// was started with) or a correlation key that an awaiting run declared.
type SignalParams struct {
	// Name is the signal's name, as the workflow awaits it.
	Name string
	// EventID is the signal's idempotency key within the tenant: the
	// provider's event id, so that a redelivered webhook is recognised.
	EventID string
	// Payload is the signal's JSON.
	Payload json.RawMessage
	// Tenant scopes every address. Defaults to "default".
	Tenant string

	// RunID addresses a run by its id.
	RunID string
	// IdempotencyKey addresses the run started with this key.
	IdempotencyKey string
	// CorrelationKey addresses whichever run of the tenant awaits Name
	// with this correlation key (AwaitOpts.CorrelationKey), now or later.
	CorrelationKey string

	// RequireMatch refuses (ErrNoMatch, nothing stored) a signal by
	// correlation key that no run awaits now, instead of keeping it for a
	// run that may await it later.
	RequireMatch bool
	// Retention is how long the signal is kept if no run consumes it.
	// Defaults to DefaultSignalRetention (7 days).
	Retention time.Duration
}

// SignalResult reports what became of a signal.
type SignalResult struct {
	// ID is the signal's id in the inbox.
	ID int64
	// RunID is the run the signal was addressed to, or, by correlation
	// key, the run it woke (empty when none awaited it yet).
	RunID string
	// Delivered reports that a waiting run was woken to consume it.
	// Otherwise it is queued in the inbox until a run awaits it or its
	// retention ends. A replay reports what the first delivery did.
	Delivered bool
	// Replayed reports an event id already received with the same signal:
	// nothing was stored, and the result is the first's.
	Replayed bool
}

// Signal delivers a signal to the inbox and wakes the run awaiting it, if
// one does: the run becomes due at once and its Await consumes the signal.
// A signal whose event id was received before with the same name, address
// and payload is a no-op answered like the first (Replayed); with any
// other, it returns ErrSignalMismatch. A run addressed by id or key that
// does not exist (in the tenant) returns ErrRunNotFound; one that has
// finished, ErrFinished: nothing could ever consume the signal.
func (c *Client) Signal(ctx context.Context, p SignalParams) (*SignalResult, error) {
	var res *SignalResult
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) (err error) {
		res, err = c.signal(ctx, tx, p)
		return err
	})
	return res, err
}

// SignalTx delivers a signal as Signal does, in the caller's transaction:
// a webhook handler records the provider's event in its own tables and
// the signal together, or neither.
func (c *Client) SignalTx(ctx context.Context, tx pgx.Tx, p SignalParams) (*SignalResult, error) {
	if tx == nil {
		return nil, errors.New("engine: SignalTx: nil transaction")
	}
	var res *SignalResult
	err := pgx.BeginFunc(ctx, tx, func(tx pgx.Tx) (err error) { // a savepoint: a refusal leaves the caller's transaction usable
		res, err = c.signal(ctx, tx, p)
		return err
	})
	return res, err
}

func (p *SignalParams) check() error {
	addresses := 0
	for _, a := range []string{p.RunID, p.IdempotencyKey, p.CorrelationKey} {
		if a != "" {
			addresses++
		}
	}
	switch {
	case !validName(p.Name):
		return fmt.Errorf("%w: name %q: want 1..255 letters, digits, '.', '-' or '_'", ErrInvalidSignal, p.Name)
	case checkKey(p.EventID) != nil:
		return fmt.Errorf("%w: event id: %v", ErrInvalidSignal, checkKey(p.EventID))
	case addresses != 1:
		return fmt.Errorf("%w: give exactly one of a run id, an idempotency key and a correlation key", ErrInvalidSignal)
	case p.CorrelationKey != "" && checkKey(p.CorrelationKey) != nil:
		return fmt.Errorf("%w: correlation key: %v", ErrInvalidSignal, checkKey(p.CorrelationKey))
	case p.RequireMatch && p.CorrelationKey == "":
		return fmt.Errorf("%w: RequireMatch is for signals by correlation key", ErrInvalidSignal)
	case p.Retention < 0:
		return fmt.Errorf("%w: negative retention", ErrInvalidSignal)
	}
	return nil
}

const insertSignalSQL = `
INSERT INTO ratchet.signals (tenant, name, event_id, run_id, correlation_key, payload, expires_at)
VALUES ($1, $2, $3, nullif($4, ''), nullif($5, ''), $6, now() + $7::interval)
ON CONFLICT (tenant, event_id) DO NOTHING
RETURNING id`

const existingSignalSQL = `
SELECT id, name, coalesce(run_id, ''), coalesce(correlation_key, ''), payload, delivered_to
FROM ratchet.signals WHERE tenant = $1 AND event_id = $2`

// wakeByRunSQL and wakeByKeySQL make the runs awaiting a signal due now.
const (
	wakeByRunSQL = `
UPDATE ratchet.runs SET next_attempt_at = now(), updated_at = now()
WHERE id = $1 AND status = 'waiting' AND waiting_for->>'kind' = 'signal' AND waiting_for->>'signal' = $2
RETURNING id`
	wakeByKeySQL = `
UPDATE ratchet.runs SET next_attempt_at = now(), updated_at = now()
WHERE tenant = $1 AND status = 'waiting' AND waiting_for->>'signal' = $2 AND waiting_for->>'correlation_key' = $3
RETURNING id`
)

func (c *Client) signal(ctx context.Context, tx pgx.Tx, p SignalParams) (*SignalResult, error) {
	if p.Tenant == "" {
		p.Tenant = DefaultTenant
	}
	if p.Retention == 0 {
		p.Retention = DefaultSignalRetention
	}
	if err := p.check(); err != nil {
		return nil, err
	}
	payload, err := canonicalJSON(p.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: payload: %v", ErrInvalidSignal, err)
	}

	// A run's address is its id, resolved here, in the tenant.
	runID := p.RunID
	if runID != "" || p.IdempotencyKey != "" {
		var lr *leasedRun
		if runID != "" {
			if err := checkRunID(runID); err != nil {
				return nil, err
			}
			lr, err = getRun(ctx, tx, runID)
		} else {
			lr, err = c.lookupKey(ctx, tx, p.Tenant, p.IdempotencyKey)
			if errors.Is(err, pgx.ErrNoRows) {
				err = fmt.Errorf("%w: no run has idempotency key %q", ErrRunNotFound, p.IdempotencyKey)
			}
		}
		switch {
		case err != nil:
			return nil, err
		case lr.Tenant != p.Tenant:
			return nil, fmt.Errorf("%w: %s", ErrRunNotFound, lr.ID) // another tenant's run does not exist for this one
		}
		runID = lr.ID
		if lr.Status.Finished() {
			// A replay of a signal it consumed is still answered.
			if res, err := c.replaySignal(ctx, tx, p, runID, payload); res != nil || err != nil {
				return res, err
			}
			return nil, fmt.Errorf("%w: %s is %s, so nothing will consume the signal", ErrFinished, runID, lr.Status)
		}
	}

	address := signalAddress(p.Tenant, p.Name, "run", runID)
	if runID == "" {
		address = signalAddress(p.Tenant, p.Name, "key", p.CorrelationKey)
	}
	if _, err := tx.Exec(ctx, addressLockSQL, address); err != nil {
		return nil, fmt.Errorf("engine: signal: lock: %w", err)
	}

	var id int64
	err = tx.QueryRow(ctx, insertSignalSQL, p.Tenant, p.Name, p.EventID, runID, p.CorrelationKey, payload, p.Retention).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return c.replaySignal(ctx, tx, p, runID, payload)
	}
	if err != nil {
		return nil, fmt.Errorf("engine: signal: %w", notMigrated(err))
	}

	res := &SignalResult{ID: id, RunID: runID}
	var rows pgx.Rows
	if runID != "" {
		rows, err = tx.Query(ctx, wakeByRunSQL, runID, p.Name)
	} else {
		rows, err = tx.Query(ctx, wakeByKeySQL, p.Tenant, p.Name, p.CorrelationKey)
	}
	if err != nil {
		return nil, fmt.Errorf("engine: signal: wake: %w", err)
	}
	woken, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("engine: signal: wake: %w", err)
	}
	if len(woken) > 0 {
		res.Delivered = true
		if res.RunID == "" {
			res.RunID = woken[0]
		}
		if _, err := tx.Exec(ctx, `UPDATE ratchet.signals SET delivered_to = $2 WHERE id = $1`, id, res.RunID); err != nil {
			return nil, fmt.Errorf("engine: signal: %w", err)
		}
	} else if p.RequireMatch {
		return nil, fmt.Errorf("%w: %q with correlation key %q", ErrNoMatch, p.Name, p.CorrelationKey)
	}
	return res, nil
}

// replaySignal answers an event id received before: like the first if it
// is the same signal, ErrSignalMismatch if not. It returns nil, nil when
// the event id is new.
func (c *Client) replaySignal(ctx context.Context, tx pgx.Tx, p SignalParams, runID string, payload []byte) (*SignalResult, error) {
	var (
		id                 int64
		name, toRun, toKey string
		stored             json.RawMessage
		deliveredTo        *string
	)
	err := tx.QueryRow(ctx, existingSignalSQL, p.Tenant, p.EventID).Scan(&id, &name, &toRun, &toKey, &stored, &deliveredTo)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("engine: signal: %w", err)
	}
	same := name == p.Name && toRun == runID && toKey == p.CorrelationKey && jsonEqual(stored, payload)
	if !same {
		return nil, fmt.Errorf("%w: event %q", ErrSignalMismatch, p.EventID)
	}
	res := &SignalResult{ID: id, RunID: toRun, Replayed: true, Delivered: deliveredTo != nil}
	if deliveredTo != nil {
		res.RunID = *deliveredTo
	}
	return res, nil
}

// jsonEqual compares two canonical JSON texts as Postgres stored them.
func jsonEqual(a, b []byte) bool {
	ca, err1 := canonicalJSON(a)
	cb, err2 := canonicalJSON(b)
	return err1 == nil && err2 == nil && bytes.Equal(ca, cb)
}
