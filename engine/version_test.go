package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
)

type shipment struct {
	Parcel string `json:"parcel"`
}

// shippingV1 and shippingV2 are two versions of one workflow: v2 weighs
// the parcel before labelling it.
func shippingV1(ctx context.Context, in shipment) (string, error) {
	if _, err := engine.Atomic(ctx, "packed", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "v1:packed") }, nil); err != nil {
		return "", err
	}
	if _, err := engine.Atomic(ctx, "labelled", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "v1:labelled") }, nil); err != nil {
		return "", err
	}
	return "v1", nil
}

func shippingV2(ctx context.Context, in shipment) (string, error) {
	if _, err := engine.Atomic(ctx, "packed", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "v2:packed") }, nil); err != nil {
		return "", err
	}
	if _, err := engine.Atomic(ctx, "weighed", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "v2:weighed") }, nil); err != nil {
		return "", err
	}
	if _, err := engine.Atomic(ctx, "labelled", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "v2:labelled") }, nil); err != nil {
		return "", err
	}
	return "v2", nil
}

// versionsV1 is the old build; versionsBoth the new one, which keeps v1 to
// drain its runs.
func versionsV1(t *testing.T) *engine.Workflows {
	t.Helper()
	w := engine.NewWorkflows()
	_, err := engine.Register(w, "shipping", shippingV1, nil)
	require.NoError(t, err)
	return w
}

func versionsBoth(t *testing.T) *engine.Workflows {
	t.Helper()
	w := engine.NewWorkflows()
	_, err := engine.Register(w, "shipping", shippingV1, &engine.WorkflowOpts{Version: 1, Drain: true})
	require.NoError(t, err)
	_, err = engine.Register(w, "shipping", shippingV2, &engine.WorkflowOpts{Version: 2})
	require.NoError(t, err)
	return w
}

// Old runs finish on v1's code and new ones run v2's, through crashes.
func TestTwoVersionsSideBySideThroughCrashes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	old := b.client(t, versionsV1(t), nil)
	res, err := old.Start(enginetest.CrashAfter(ctx, "packed"), engine.StartParams{Workflow: "shipping", IdempotencyKey: "old", Input: []byte(`{"parcel": "p1"}`)})
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	require.Equal(t, 1, res.Run.WorkflowVersion)

	// The new build is deployed; the old run's process is gone.
	deployed := b.client(t, versionsBoth(t), nil)
	fresh, err := deployed.Start(enginetest.CrashAfter(ctx, "weighed"), engine.StartParams{Workflow: "shipping", IdempotencyKey: "new", Input: []byte(`{"parcel": "p2"}`)})
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	require.Equal(t, 2, fresh.Run.WorkflowVersion, "new runs start on the newest version that does not drain")

	another := b.client(t, versionsBoth(t), nil)
	for _, id := range []string{res.Run.ID, fresh.Run.ID} {
		b.expireLease(t, id)
		_, err := another.TakeOver(ctx, id)
		require.NoError(t, err)
	}
	oldRun := enginetest.RequireStatus(t, another, res.Run.ID, engine.StatusSucceeded)
	require.JSONEq(t, `"v1"`, string(oldRun.Output))
	enginetest.RequirePhases(t, another, res.Run.ID, "packed", "labelled")
	newRun := enginetest.RequireStatus(t, another, fresh.Run.ID, engine.StatusSucceeded)
	require.JSONEq(t, `"v2"`, string(newRun.Output))
	enginetest.RequirePhases(t, another, fresh.Run.ID, "packed", "weighed", "labelled")
	require.Equal(t, 1, b.counter(t, "v1:packed"))
	require.Equal(t, 1, b.counter(t, "v1:labelled"))
	for _, c := range []string{"v2:packed", "v2:weighed", "v2:labelled"} {
		require.Equal(t, 1, b.counter(t, c), "%s: the new run's, once", c)
	}
}

// A run whose version no live process registers is not failed: no one
// claims it, and it waits, due, until a process that serves it comes.
func TestARunOfAVersionNobodyServesWaitsForOneThatDoes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	res, err := b.client(t, versionsV1(t), nil).Start(enginetest.CrashAfter(ctx, "packed"),
		engine.StartParams{Workflow: "shipping", IdempotencyKey: "old", Input: []byte(`{"parcel": "p1"}`)})
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	b.expireLease(t, res.Run.ID)

	onlyV2 := engine.NewWorkflows()
	_, err = engine.Register(onlyV2, "shipping", shippingV2, &engine.WorkflowOpts{Version: 2})
	require.NoError(t, err)
	v2 := b.client(t, onlyV2, nil)
	require.NoError(t, v2.Announce(ctx, time.Minute))
	require.Equal(t, []string{"shipping@2"}, onlyV2.Served())

	claimed, err := v2.ClaimDue(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, claimed, "v2's process does not claim a v1 run")
	_, err = v2.TakeOver(ctx, res.Run.ID)
	require.ErrorIs(t, err, engine.ErrUnknownWorkflow)
	require.Contains(t, err.Error(), "shipping@1")
	run := enginetest.RequireStatus(t, v2, res.Run.ID, engine.StatusRunning)
	require.Equal(t, res.Run.LeaseToken, run.LeaseToken, "untouched")
	served, err := v2.Served(ctx, run)
	require.NoError(t, err)
	require.False(t, served, "no live process runs shipping@1")

	v1 := b.client(t, versionsBoth(t), nil)
	require.NoError(t, v1.Announce(ctx, time.Minute))
	served, err = v1.Served(ctx, run)
	require.NoError(t, err)
	require.True(t, served)
	processes, err := v1.Processes(ctx)
	require.NoError(t, err)
	require.Len(t, processes, 2)
	claimed, err = v1.ClaimDue(ctx, 10)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	final, err := v1.Continue(ctx, claimed[0])
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, final.Status)
	require.NoError(t, v1.Withdraw(ctx))
	processes, err = v1.Processes(ctx)
	require.NoError(t, err)
	require.Len(t, processes, 1)
}

func TestRegisteringOneVersionTwiceIsRefused(t *testing.T) {
	t.Parallel()
	w := versionsBoth(t)
	_, err := engine.Register(w, "shipping", shippingV2, &engine.WorkflowOpts{Version: 2})
	require.ErrorContains(t, err, `"shipping" version 2 registered twice`)

	draining := engine.NewWorkflows()
	_, err = engine.Register(draining, "shipping", shippingV1, &engine.WorkflowOpts{Drain: true})
	require.NoError(t, err)
	c := setup(t).client(t, draining, nil)
	_, err = c.Start(context.Background(), engine.StartParams{Workflow: "shipping", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.ErrorIs(t, err, engine.ErrUnknownWorkflow)
	require.ErrorContains(t, err, "drains")
}

// A patch inside one version: runs that passed the patched point before it
// was deployed keep the old path; runs that reach it take the new one, and
// every replay agrees.
func TestPatchedKeepsOldRunsOnTheOldPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	unpatched := engine.NewWorkflows()
	_, err := engine.Register(unpatched, "fee", func(ctx context.Context, _ struct{}) (string, error) {
		if _, err := engine.Atomic(ctx, "quoted", func(context.Context, pgx.Tx) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		if _, err := engine.Atomic(ctx, "fee_in_euros", func(context.Context, pgx.Tx) (int, error) { return 2, nil }, nil); err != nil {
			return "", err
		}
		_, err := engine.Atomic(ctx, "billed", func(context.Context, pgx.Tx) (int, error) { return 3, nil }, nil)
		return "old", err
	}, nil)
	require.NoError(t, err)
	patched := engine.NewWorkflows()
	_, err = engine.Register(patched, "fee", func(ctx context.Context, _ struct{}) (string, error) {
		if _, err := engine.Atomic(ctx, "quoted", func(context.Context, pgx.Tx) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		path := "old"
		if engine.Patched(ctx, "fee-in-cents") {
			path = "new"
			if _, err := engine.Atomic(ctx, "fee_in_cents", func(context.Context, pgx.Tx) (int, error) { return 200, nil }, nil); err != nil {
				return "", err
			}
		} else if _, err := engine.Atomic(ctx, "fee_in_euros", func(context.Context, pgx.Tx) (int, error) { return 2, nil }, nil); err != nil {
			return "", err
		}
		if engine.Patched(ctx, "fee-in-cents") != (path == "new") {
			return "", errors.New("a patch's answer changed within one execution")
		}
		_, err := engine.Atomic(ctx, "billed", func(context.Context, pgx.Tx) (int, error) { return 3, nil }, nil)
		return path, err
	}, nil)
	require.NoError(t, err)

	// Started before the patch: past the patched point when it crashed.
	res, err := b.client(t, unpatched, nil).Start(enginetest.CrashAfter(ctx, "fee_in_euros"), engine.StartParams{Workflow: "fee", IdempotencyKey: "old", Input: []byte(`{}`)})
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	c := b.client(t, patched, nil)
	b.expireLease(t, res.Run.ID)
	run, err := c.TakeOver(ctx, res.Run.ID)
	require.NoError(t, err)
	require.JSONEq(t, `"old"`, string(run.Output), "the old path")
	enginetest.RequirePhases(t, c, run.ID, "quoted", "fee_in_euros", "billed")

	// Started after: the marker is journaled, and a replay agrees.
	fresh, err := c.Start(enginetest.CrashAfter(ctx, "fee_in_cents"), engine.StartParams{Workflow: "fee", IdempotencyKey: "new", Input: []byte(`{}`)})
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	b.expireLease(t, fresh.Run.ID)
	run, err = c.TakeOver(ctx, fresh.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status, "%+v", run.Error)
	require.JSONEq(t, `"new"`, string(run.Output))
	phases := enginetest.RequirePhases(t, c, run.ID, "quoted", "patch:fee-in-cents", "fee_in_cents", "billed")
	require.Equal(t, engine.KindPatch, phases[1].Kind)
}
