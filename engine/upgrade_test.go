package engine_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/migrations"
	"github.com/ratchet-run/ratchet/steps"
)

// previousClaimSQL is the claim of the release before migration 0013,
// verbatim but for RETURNING: it names the (tenant, idempotency_key)
// constraint and writes key_digest, which only the contract migration 0014
// drops.
const previousClaimSQL = `
INSERT INTO ratchet.runs (id, tenant, idempotency_key, workflow, workflow_version, input, fingerprint,
	traceparent, status, lease_owner, lease_token, lease_expires_at, attempt, key_format, key_digest)
SELECT $1, $2, $3, $4, $5, $6, $7, nullif($8, ''),
	CASE WHEN $9 THEN 'running' ELSE 'pending' END,
	CASE WHEN $9 THEN $10 END,
	CASE WHEN $9 THEN 1 ELSE 0 END,
	CASE WHEN $9 THEN now() + $11::interval END,
	CASE WHEN $9 THEN 1 ELSE 0 END,
	$12::smallint,
	CASE WHEN $12::smallint = 3 THEN ratchet.request_digest($2, $3) END
ON CONFLICT (tenant, idempotency_key) DO NOTHING
RETURNING id`

// previousClaim claims key as a process of the previous release would:
// the run's id, or "" when the key exists.
func previousClaim(ctx context.Context, b *testBundle, key string) (string, error) {
	rows, err := b.pool.Query(ctx, previousClaimSQL, ulid.Make().String(), "default", key, "steps3", 1,
		`{"Key":"`+key+`"}`, bytes.Repeat([]byte{7}, 32), "", false, "old-process", "1 minute", 3)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var id string
	for rows.Next() {
		if err := rows.Scan(&id); err != nil {
			return "", err
		}
	}
	return id, rows.Err()
}

// startAtOnce starts key from n callers at once and returns how many
// created the run; any error fails the test.
func startAtOnce(t *testing.T, c *engine.Client, key string, n int) int {
	t.Helper()
	var (
		mu      sync.Mutex
		created int
		wg      sync.WaitGroup
		start   = make(chan struct{})
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := c.Start(context.Background(), engine.StartParams{
				Workflow: "steps3", IdempotencyKey: key, Input: []byte(`{"Key":"` + key + `"}`)})
			if !assertNoError(t, err) {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if res.Outcome == engine.OutcomeCreated {
				created++
			}
		}()
	}
	close(start)
	wg.Wait()
	return created
}

// A rolling upgrade across migration 0013: `ratchet migrate
// --keep-compatible` leaves the contract migration 0014 unapplied, and
// both releases claim keys side by side, each seeing the other's runs;
// the second `ratchet migrate` drops what only the previous release used.
func TestARollingUpgradeKeepsBothReleasesClaiming(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, err := b.pool.Exec(ctx, `DROP SCHEMA ratchet CASCADE`)
	require.NoError(t, err)
	res, err := migrations.Apply(ctx, b.pool, &migrations.ApplyOpts{KeepCompatible: true})
	require.NoError(t, err)
	require.Equal(t, []string{"0014_drop_request_key_index.sql"}, res.Deferred)
	require.NoError(t, migrations.Check(ctx, b.pool), "this release runs without its contract migrations")

	c := b.client(t, barrierSteps(t, func(context.Context, string) {}), &engine.Config{KeyFormat: 3})

	// The previous release's run is this release's too: its key exists.
	oldRun, err := previousClaim(ctx, b, "made-by-the-previous-release")
	require.NoError(t, err)
	require.NotEmpty(t, oldRun)
	_, err = c.Start(ctx, engine.StartParams{Workflow: "steps3", IdempotencyKey: "made-by-the-previous-release",
		Input: []byte(`{"Key":"made-by-the-previous-release"}`)})
	var mismatch *engine.MismatchError
	require.True(t, errors.As(err, &mismatch), "the key exists with another fingerprint: %v", err)
	require.Equal(t, oldRun, mismatch.RunID)
	page, err := c.ListRuns(ctx, engine.ListParams{IdempotencyKey: "made-by-the-previous-release"})
	require.NoError(t, err)
	require.Len(t, page, 1)

	// And this release's run is the previous release's: its claim finds
	// the key.
	require.Equal(t, 1, startAtOnce(t, c, "made-by-this-release", 12))
	again, err := previousClaim(ctx, b, "made-by-this-release")
	require.NoError(t, err)
	require.Empty(t, again, "the previous release's claim conflicts with this release's run")

	// Once every process runs this release, the rest is applied.
	res, err = migrations.Apply(ctx, b.pool, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"0014_drop_request_key_index.sql"}, res.Applied)
	require.NoError(t, migrations.Check(ctx, b.pool))
	_, err = previousClaim(ctx, b, "too-late")
	require.Error(t, err, "after 0014 the previous release's claim has no constraint to name")

	require.Equal(t, 1, startAtOnce(t, c, "after-the-upgrade", 12))
	page, err = c.ListRuns(ctx, engine.ListParams{ChildKey: string(steps.ChildKeyV3("default", "after-the-upgrade", "two"))})
	require.NoError(t, err)
	require.Len(t, page, 1, "the format-3 key finds its run by the request's digest")
	require.Equal(t, "after-the-upgrade", page[0].IdempotencyKey)
	page, err = c.ListRuns(ctx, engine.ListParams{IdempotencyKey: "made-by-the-previous-release"})
	require.NoError(t, err)
	require.Len(t, page, 1)
}
