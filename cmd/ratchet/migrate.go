package main

import (
	"fmt"

	"github.com/ratchet-run/ratchet/migrations"
)

type migrateCmd struct {
	dbFlags
}

func (c *migrateCmd) Run(e *env) error {
	pool, err := c.connect(e.ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := migrations.Apply(e.ctx, pool, nil)
	if err != nil {
		return err
	}
	if len(res.Applied) == 0 && len(res.RiverVersions) == 0 {
		fmt.Fprintln(e.stdout, "database is up to date")
		return nil
	}
	for _, name := range res.Applied {
		fmt.Fprintln(e.stdout, "applied", name)
	}
	if len(res.RiverVersions) > 0 {
		fmt.Fprintf(e.stdout, "applied River migrations %v\n", res.RiverVersions)
	}
	return nil
}
