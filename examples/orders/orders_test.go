package orders_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/examples/orders"
	"github.com/ratchet-run/ratchet/worker"
)

// An order of three parcels ships them as three child runs, each booked
// once, and finishes with their labels; a bad order is refused.
func TestAnOrderShipsEachParcelOnceAsAChild(t *testing.T) {
	t.Parallel()
	db := enginetest.New(t, nil)
	ctx := context.Background()
	require.NoError(t, orders.Setup(ctx, db.Pool))
	flows := engine.NewWorkflows()
	require.NoError(t, orders.Register(flows))
	w, err := worker.New(db.Pool, &worker.Config{Engine: engine.Config{Workflows: flows}})
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	c := w.Engine()
	input, _ := json.Marshal(orders.Order{ID: "o-1", Parcels: []string{"a", "b", "c"}})
	res, err := c.Start(ctx, engine.StartParams{Workflow: orders.OrderWorkflow, IdempotencyKey: "o-1", Input: input})
	require.NoError(t, err)
	var run *engine.Run
	require.Eventually(t, func() bool {
		run, err = c.GetRun(ctx, res.Run.ID)
		return err == nil && run.Status.Finished()
	}, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, engine.StatusSucceeded, run.Status, "%+v", run.Error)
	var labels []string
	require.NoError(t, json.Unmarshal(run.Output, &labels))
	require.Equal(t, []string{"lbl-o-1-a", "lbl-o-1-b", "lbl-o-1-c"}, labels)
	children, err := c.Children(ctx, run.ID)
	require.NoError(t, err)
	require.Len(t, children, 3)
	var bookings int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders.bookings WHERE order_id = 'o-1'`).Scan(&bookings))
	require.Equal(t, 3, bookings)

	bad, err := c.Start(ctx, engine.StartParams{Workflow: orders.OrderWorkflow, IdempotencyKey: "o-2", Input: []byte(`{"id": "o-2", "parcels": []}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, bad.Run.Status)
	require.Equal(t, "invalid_order", bad.Run.Error.Code)
}
