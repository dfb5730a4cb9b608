// Package orders is a fan-out, written as a user of the public packages
// would write it: an order starts one shipment workflow per parcel, as
// child runs, and finishes with their labels once every shipment has.
// Each shipment books its parcel with the carrier in one atomic phase.
//
// A crash anywhere — the order's process between starting two shipments,
// a shipment's process mid-booking — starts no shipment twice and books
// no parcel twice: a child's key is derived from the order's run and
// phase, and each shipment run records itself in the phase that books.
package orders

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
)

// Workflow names.
const (
	OrderWorkflow    = "order"
	ShipmentWorkflow = "shipment"
)

// Order is an order's input: its id and its parcels.
type Order struct {
	ID      string   `json:"id"`
	Parcels []string `json:"parcels"`
}

// Shipment is a shipment's input.
type Shipment struct {
	Order  string `json:"order"`
	Parcel string `json:"parcel"`
}

// Setup creates the example's tables if they do not exist.
func Setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
		SELECT pg_advisory_xact_lock(hashtext('orders.setup'));
		CREATE SCHEMA IF NOT EXISTS orders;
		-- One booking per parcel; every shipment run that booked, so that
		-- a parcel shipped by two runs would show.
		CREATE TABLE IF NOT EXISTS orders.bookings (
			order_id  text        NOT NULL,
			parcel    text        NOT NULL,
			run_id    text        NOT NULL,
			label     text        NOT NULL,
			booked_at timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (order_id, parcel, run_id)
		)`)
	if err != nil {
		return fmt.Errorf("orders: setup: %w", err)
	}
	return nil
}

// Register adds the order and the shipment workflows.
func Register(workflows *engine.Workflows) error {
	if _, err := engine.Register(workflows, OrderWorkflow, order, nil); err != nil {
		return err
	}
	_, err := engine.Register(workflows, ShipmentWorkflow, ship, nil)
	return err
}

func order(ctx context.Context, in Order) ([]string, error) {
	if in.ID == "" || len(in.Parcels) == 0 || len(in.Parcels) > 100 {
		return nil, steps.Permanent("invalid_order", errors.New("an order has an id and 1..100 parcels"))
	}
	ids := make([]string, len(in.Parcels))
	for i, p := range in.Parcels {
		id, err := engine.StartChild(ctx, "ship-"+p, ShipmentWorkflow, Shipment{Order: in.ID, Parcel: p}, nil)
		if err != nil {
			return nil, err
		}
		ids[i] = id
	}
	labels := make([]string, len(ids))
	for i, id := range ids {
		label, err := engine.AwaitChild[string](ctx, "shipped-"+in.Parcels[i], id)
		if err != nil {
			return nil, err
		}
		labels[i] = label
	}
	return labels, nil
}

func ship(ctx context.Context, in Shipment) (string, error) {
	info, _ := engine.RunInfoFrom(ctx)
	return engine.Atomic(ctx, "booked", func(ctx context.Context, tx pgx.Tx) (string, error) {
		label := "lbl-" + in.Order + "-" + in.Parcel
		_, err := tx.Exec(ctx, `INSERT INTO orders.bookings (order_id, parcel, run_id, label) VALUES ($1, $2, $3, $4)`,
			in.Order, in.Parcel, info.RunID, label)
		return label, err
	}, nil)
}
