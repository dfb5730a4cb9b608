package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/steps"
)

type parcelOrder struct {
	Parcels []string `json:"parcels"`
	// FailAfter fails the order after its shipments (it compensates).
	FailAfter bool `json:"fail_after,omitempty"`
}

// orderFlows registers "order", which starts a "shipment" child per
// parcel and awaits them all, and "shipment", which records the parcel
// and, for a parcel named "held", awaits signal "go" first; "lost" fails.
func orderFlows(t *testing.T) *engine.Workflows {
	t.Helper()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "order", func(ctx context.Context, in parcelOrder) ([]string, error) {
		ids := make([]string, len(in.Parcels))
		for i, p := range in.Parcels {
			id, err := engine.StartChild(ctx, "ship-"+p, "shipment", p, &engine.ChildOpts{
				Compensate: func(ctx context.Context, tx pgx.Tx, child *engine.Run) error {
					_, err := bump(ctx, tx, "returned-"+p)
					return err
				}})
			if err != nil {
				return nil, err
			}
			ids[i] = id
		}
		var labels []string
		for i, id := range ids {
			label, err := engine.AwaitChild[string](ctx, "shipped-"+in.Parcels[i], id)
			if err != nil {
				return nil, err
			}
			labels = append(labels, label)
		}
		if in.FailAfter {
			return nil, steps.Permanent("order_refused", errors.New("the order was refused after shipping"))
		}
		return labels, nil
	}, nil)
	require.NoError(t, err)
	_, err = engine.Register(workflows, "shipment", func(ctx context.Context, parcel string) (string, error) {
		if parcel == "held" {
			if _, err := engine.Await[string](ctx, "go", nil); err != nil {
				return "", err
			}
		}
		if parcel == "lost" {
			return "", steps.Permanent("parcel_lost", errors.New("the carrier lost it"))
		}
		return engine.Atomic(ctx, "labelled", func(ctx context.Context, tx pgx.Tx) (string, error) {
			n, err := bump(ctx, tx, "shipped-"+parcel)
			return fmt.Sprintf("label-%s-%d", parcel, n), err
		}, nil)
	}, nil)
	require.NoError(t, err)
	return workflows
}

func startOrderOf(t *testing.T, c *engine.Client, key string, in parcelOrder) *engine.Run {
	t.Helper()
	input, _ := json.Marshal(in)
	res, err := c.Start(context.Background(), engine.StartParams{Workflow: "order", IdempotencyKey: key, Input: input})
	require.NoError(t, err)
	return res.Run
}

// An order fans out to a shipment per parcel, parks while they run, and
// finishes with their results; the children name their parent, and the
// parent lists them.
func TestAParentFansOutToChildrenAndAwaitsThemParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.client(t, orderFlows(t), nil)
	run := startOrderOf(t, c, "order-1", parcelOrder{Parcels: []string{"a", "held", "b"}})
	require.Equal(t, engine.StatusWaiting, run.Status, "parked for its first child")
	children, err := c.Children(ctx, run.ID)
	require.NoError(t, err)
	require.Len(t, children, 3)
	for _, ch := range children {
		require.Equal(t, run.ID, *ch.ParentRunID)
		require.Equal(t, engine.StatusPending, ch.Status, "started for a worker")
	}
	require.Equal(t, childKey(t, run, "ship-a"), children[0].IdempotencyKey, "a step's child key")

	startRecoverer(t, c)
	// The shipment of "held" awaits its signal: the order waits for it.
	require.Eventually(t, func() bool {
		why, err := c.Why(ctx, run.ID)
		return err == nil && why.Blocked != nil && why.Blocked.Reason == engine.BlockedChild && why.Blocked.Child == children[1].ID
	}, 30*time.Second, 10*time.Millisecond, "the order awaits the held shipment")
	_, err = c.Signal(ctx, engine.SignalParams{RunID: children[1].ID, Name: "go", EventID: "go-1", Payload: []byte(`"now"`)})
	require.NoError(t, err)
	done := eventuallySucceeds(t, c, run.ID)
	var labels []string
	require.NoError(t, json.Unmarshal(done.Output, &labels))
	require.Equal(t, []string{"label-a-1", "label-held-1", "label-b-1"}, labels)
	enginetest.RequirePhases(t, c, run.ID, "ship-a", "ship-held", "ship-b", "shipped-a", "shipped-held", "shipped-b")
}

// A parent killed right after starting a child, resumed by another
// process, finds the same child: no child is started twice.
func TestAResumedParentStartsNoSecondChild(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := orderFlows(t)
	c := b.client(t, workflows, nil)
	input, _ := json.Marshal(parcelOrder{Parcels: []string{"a", "b"}})
	_, err := c.Start(enginetest.CrashAfter(ctx, "ship-a"), engine.StartParams{Workflow: "order", IdempotencyKey: "order-1", Input: input})
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	id := b.runIDForKey(t, "order-1")
	b.expireLease(t, id)
	other := b.client(t, workflows, nil)
	startRecoverer(t, other)
	eventuallySucceeds(t, other, id)
	children, err := other.Children(ctx, id)
	require.NoError(t, err)
	require.Len(t, children, 2, "one child per parcel")
	require.Equal(t, 1, b.counter(t, "shipped-a"))
	require.Equal(t, 1, b.counter(t, "shipped-b"))
}

// A child that fails makes AwaitChild return its error, permanent: the
// parent fails with the child's code, and compensates the children that
// shipped.
func TestAFailedChildFailsTheParentWithItsCode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, orderFlows(t), nil)
	startRecoverer(t, c)
	run := startOrderOf(t, c, "order-1", parcelOrder{Parcels: []string{"a", "lost"}})
	final := eventuallyFinishes(t, c, run.ID)
	require.Equal(t, engine.StatusCompensated, final.Status)
	require.Equal(t, "parcel_lost", final.Error.Code)
	require.Equal(t, 1, b.counter(t, "returned-a"), "the shipped child compensated by ChildOpts.Compensate")
	require.Zero(t, b.counter(t, "returned-lost"), "a failed child has nothing left to undo")
}

// Cancelling a parent that awaits a child cancels the child.
func TestCancellingAParentCancelsItsChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.client(t, orderFlows(t), nil)
	run := startOrderOf(t, c, "order-1", parcelOrder{Parcels: []string{"held"}})
	children, err := c.Children(ctx, run.ID)
	require.NoError(t, err)
	require.Len(t, children, 1)
	startRecoverer(t, c)
	require.Eventually(t, func() bool {
		ch, err := c.GetRun(ctx, children[0].ID)
		return err == nil && ch.Status == engine.StatusWaiting
	}, 30*time.Second, 10*time.Millisecond, "the child awaits its signal")
	_, err = c.Cancel(ctx, run.ID)
	require.NoError(t, err)
	final := eventuallyFinishes(t, c, run.ID)
	require.Equal(t, engine.StatusCompensated, final.Status)
	child := eventuallyFinishes(t, c, children[0].ID)
	require.Equal(t, engine.StatusCancelled, child.Status, "cancelled with its parent")
	require.Zero(t, b.counter(t, "returned-held"), "an unfinished child is cancelled, not compensated by the option")
}

// Only a run's own children can be awaited.
func TestAwaitingARunThatIsNoChildFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := orderFlows(t)
	_, err := engine.Register(workflows, "nosy", func(ctx context.Context, other string) (string, error) {
		return engine.AwaitChild[string](ctx, "peek", other)
	}, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	stranger := startOrderOf(t, c, "order-1", parcelOrder{})
	input, _ := json.Marshal(stranger.ID)
	res, err := c.Start(ctx, engine.StartParams{Workflow: "nosy", IdempotencyKey: "nosy-1", Input: input})
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Run.Status)
	require.Equal(t, engine.CodeInvalidPhase, res.Run.Error.Code)
	require.Contains(t, res.Run.Error.Message, "is not a child of run")
}

func eventuallyFinishes(t *testing.T, c *engine.Client, runID string) *engine.Run {
	t.Helper()
	var run *engine.Run
	require.Eventually(t, func() bool {
		got, err := c.GetRun(context.Background(), runID)
		run = got
		return err == nil && got.Status.Finished()
	}, 30*time.Second, 10*time.Millisecond, "run %s finishes", runID)
	return run
}
