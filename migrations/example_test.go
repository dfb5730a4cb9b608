package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/migrations"
)

// Apply at deploy (ratchet migrate does the same); Check at start-up or in
// a readiness probe.
func ExampleApply() {
	ctx := context.Background()
	db, err := enginetest.NewDatabase(ctx, nil) // migrated: undo it, to start from nothing
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Pool.Exec(ctx, `DROP SCHEMA `+migrations.Schema+` CASCADE`); err != nil {
		log.Fatal(err)
	}
	fmt.Println(errors.Is(migrations.Check(ctx, db.Pool), migrations.ErrPending))

	all, err := migrations.All()
	if err != nil {
		log.Fatal(err)
	}
	var first migrations.Migration = all[0]
	fmt.Println(first.Version, first.Name)

	res, err := migrations.Apply(ctx, db.Pool, &migrations.ApplyOpts{})
	if err != nil {
		log.Fatal(err)
	}
	var applied *migrations.Result = res
	fmt.Println(len(applied.Applied) == len(all), len(applied.RiverVersions) > 0)
	fmt.Println(migrations.Check(ctx, db.Pool))

	again, err := migrations.Apply(ctx, db.Pool, nil)
	fmt.Println(len(again.Applied), len(again.RiverVersions), err)
	// Output:
	// true
	// 1 0001_runs_and_phases.sql
	// true true
	// <nil>
	// 0 0 <nil>
}
