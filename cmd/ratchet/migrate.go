package main

import (
	"fmt"

	"github.com/ratchet-run/ratchet/migrations"
)

type migrateCmd struct {
	dbFlags
	KeepCompatible bool `help:"Leave the migrations that drop what the previous release uses (contract migrations) for later: run with it before a rolling upgrade, and again without it once every process runs this release." env:"RATCHET_KEEP_COMPATIBLE"`
}

func (c *migrateCmd) Run(e *env) error {
	pool, err := c.connect(e.ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := migrations.Apply(e.ctx, pool, &migrations.ApplyOpts{KeepCompatible: c.KeepCompatible})
	if err != nil {
		return err
	}
	if len(res.Applied) == 0 && len(res.RiverVersions) == 0 && len(res.Deferred) == 0 {
		fmt.Fprintln(e.stdout, "database is up to date")
		return nil
	}
	for _, name := range res.Applied {
		fmt.Fprintln(e.stdout, "applied", name)
	}
	if len(res.RiverVersions) > 0 {
		fmt.Fprintf(e.stdout, "applied River migrations %v\n", res.RiverVersions)
	}
	for _, name := range res.Deferred {
		fmt.Fprintf(e.stdout, "left %s for later: it drops what the previous release uses; run `ratchet migrate` again once every process runs this release\n", name)
	}
	return nil
}
