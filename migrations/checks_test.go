package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/internal/testdb"
)

// The rules of a run's row that 0019 moved from CHECK constraints to a
// trigger still refuse what they refused, by INSERT and by UPDATE, with
// the error the constraint gave: SQLSTATE 23514 naming it.
func TestRunRulesRefuseWhatTheirConstraintsDid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t, nil)
	// A valid run, leased and unfinished; each case breaks one rule.
	const insert = `INSERT INTO ratchet.runs (id, tenant, idempotency_key, workflow, workflow_version, input,
		fingerprint, status, lease_owner, lease_token, lease_expires_at, attempt)
		VALUES ($1, 't', $1, 'w', 1, '{}', decode(repeat('ab', 32), 'hex'), 'running', 'me', 1, now() + interval '1 minute', 1)`
	for i, tc := range []struct {
		rule     string
		breaking string // an UPDATE of the valid run $1, or an INSERT of a run $1 of its own
	}{
		{"runs_status_check", `UPDATE ratchet.runs SET status = 'sleeping' WHERE id = $1`},
		{"runs_fingerprint_check", `UPDATE ratchet.runs SET fingerprint = '\x00' WHERE id = $1`},
		{"runs_idempotency_key_check", `UPDATE ratchet.runs SET idempotency_key = '' WHERE id = $1`},
		{"runs_idempotency_key_check", `INSERT INTO ratchet.runs (id, tenant, idempotency_key, workflow, workflow_version, input, fingerprint)
			VALUES ($1 || '-long', 't', repeat('k', 256), 'w', 1, '{}', decode(repeat('ab', 32), 'hex'))`},
		{"runs_key_format_check", `UPDATE ratchet.runs SET key_format = 4 WHERE id = $1`},
		{"runs_finished_consistent", `UPDATE ratchet.runs SET status = 'succeeded', lease_expires_at = NULL WHERE id = $1`},
		{"runs_finished_consistent", `UPDATE ratchet.runs SET finished_at = now(), lease_expires_at = NULL WHERE id = $1`},
		{"runs_finished_unleased", `UPDATE ratchet.runs SET status = 'failed', finished_at = now() WHERE id = $1`},
		{"runs_concurrency_declared", `UPDATE ratchet.runs SET concurrency_key = 'refunds/cus_1' WHERE id = $1`},
		{"runs_concurrency_limit_positive", `UPDATE ratchet.runs SET concurrency_key = 'k', concurrency_limit = 0 WHERE id = $1`},
		{"runs_slot_keyed", `UPDATE ratchet.runs SET holds_slot = true WHERE id = $1`},
		{"runs_queue_started_queued", `UPDATE ratchet.runs SET queue_started_at = now() WHERE id = $1`},
		{"runs_waiting_described", `UPDATE ratchet.runs SET status = 'waiting' WHERE id = $1`},
	} {
		requireRefused(t, pool, insert, tc.breaking, tc.rule, fmt.Sprintf("run-%d", i))
	}

	// And what the rules allow still goes: a run finished, unleased, and
	// one keyed and queued holding its slot.
	_, err := pool.Exec(ctx, insert, "run-fine")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE ratchet.runs SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL,
		lease_owner = NULL WHERE id = 'run-fine'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, insert, "run-keyed")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE ratchet.runs SET concurrency_key = 'k', concurrency_limit = 1, holds_slot = true,
		queue = 'gateway', queue_started_at = now() WHERE id = 'run-keyed'`)
	require.NoError(t, err)
}

// The journal's rules, moved to a trigger by 0020, refuse what their
// constraints did, by INSERT and by UPDATE.
func TestPhaseRulesRefuseWhatTheirConstraintsDid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t, nil)
	_, err := pool.Exec(ctx, `INSERT INTO ratchet.runs (id, tenant, idempotency_key, workflow, workflow_version, input, fingerprint)
		VALUES ('run', 't', 'k', 'w', 1, '{}', decode(repeat('ab', 32), 'hex'))`)
	require.NoError(t, err)
	// A valid journal row $1 (its seq and name); each case breaks one rule.
	const insert = `INSERT INTO ratchet.phases (run_id, seq, name, kind, attempts, started_at, finished_at)
		VALUES ('run', $1::integer, 'phase-' || $1::text, 'atomic', 1, now(), now())`
	for i, tc := range []struct {
		rule     string
		breaking string // an UPDATE of the valid row $1, or an INSERT of its own
	}{
		{"phases_kind_check", `UPDATE ratchet.phases SET kind = 'nap' WHERE run_id = 'run' AND seq = $1`},
		{"phases_name_check", `UPDATE ratchet.phases SET name = '' WHERE run_id = 'run' AND seq = $1`},
		{"phases_name_check", `INSERT INTO ratchet.phases (run_id, seq, name, kind, started_at, finished_at)
			VALUES ('run', $1::integer + 1000, repeat('n', 256), 'step', now(), now())`},
		{"phases_seq_check", `UPDATE ratchet.phases SET seq = -1 WHERE run_id = 'run' AND seq = $1`},
		{"phases_attempts_check", `UPDATE ratchet.phases SET attempts = 0 WHERE run_id = 'run' AND seq = $1`},
	} {
		requireRefused(t, pool, insert, tc.breaking, tc.rule, i)
	}
	for i, kind := range []string{"atomic", "step", "sleep", "signal", "compensation", "patch", "start_child", "await_child"} {
		_, err := pool.Exec(ctx, `INSERT INTO ratchet.phases (run_id, seq, name, kind, started_at, finished_at)
			VALUES ('run', $1, $2, $2, now(), now())`, 100+i, kind)
		require.NoError(t, err, kind)
	}
}

// requireRefused inserts a valid row (valid with arg), then runs breaking
// with arg: it must fail as the CHECK constraint rule did.
func requireRefused(t *testing.T, pool *pgxpool.Pool, valid, breaking, rule string, arg any) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, valid, arg)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, breaking, arg)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: %s was accepted (%v)", rule, breaking, err)
	require.Equal(t, "23514", pgErr.Code, "%s: %v", rule, err)
	require.Equal(t, rule, pgErr.ConstraintName, "%s: %v", rule, err)
}
