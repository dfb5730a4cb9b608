package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"text/tabwriter"

	"github.com/ratchet-run/ratchet/engine"
)

type checkDeployCmd struct {
	dbFlags
	appFlags
	JSON        bool `name:"json" help:"Print the report as JSON (for CI/CD pipelines)."`
	Concurrency int  `name:"concurrency" help:"Runs replayed at once (default: the CPUs)."`
}

// Run checks every unfinished run against this build's workflows; it
// fails (exit 1) when any cannot be finished by it.
func (c *checkDeployCmd) Run(e *env) error {
	pool, err := c.connect(e.ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	workflows, _, err := registry(pool, c.appFlags)
	if err != nil {
		return err
	}
	client, err := engine.NewClient(pool, &engine.Config{Workflows: workflows})
	if err != nil {
		return err
	}
	if err := client.Ping(e.ctx); err != nil {
		return err // names the migrations to apply
	}
	report, err := client.CheckDeploy(e.ctx, &engine.CheckDeployOpts{Concurrency: c.Concurrency})
	if err != nil {
		return err
	}
	if c.JSON {
		out, err := json.MarshalIndent(report, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintln(e.stdout, string(out))
	} else {
		printReport(e, report, workflows.Served())
	}
	if !report.OK() {
		return fmt.Errorf("%d of %d runs in flight cannot be finished by this build (%d incompatible, %d of versions it does not register)",
			report.Incompatible+report.Unregistered, report.Checked, report.Incompatible, report.Unregistered)
	}
	return nil
}

func printReport(e *env, r *engine.DeployReport, serves []string) {
	fmt.Fprintf(e.stdout, "this build serves %v\n", serves)
	fmt.Fprintf(e.stdout, "checked %d runs in flight in %d ms: %d compatible, %d incompatible, %d unregistered\n",
		r.Checked, r.TookMS, r.Compatible, r.Incompatible, r.Unregistered)
	if len(r.InFlight) > 0 {
		fmt.Fprintln(e.stdout, "in flight by version:")
		tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
		for _, v := range slices.Sorted(maps.Keys(r.InFlight)) {
			fmt.Fprintf(tw, "  %s\t%d\n", v, r.InFlight[v])
		}
		tw.Flush() //nolint:errcheck // stdout
	}
	if len(r.Problems) == 0 {
		return
	}
	fmt.Fprintln(e.stdout, "cannot be finished by this build:")
	tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  RUN\tWORKFLOW\tSTATUS\tVERDICT\tAT\tREASON")
	for _, p := range r.Problems {
		at := "-"
		if p.Seq != nil {
			at = fmt.Sprintf("%d: %s", *p.Seq, p.Journaled)
			if p.Called != "" {
				at += " ≠ " + p.Called
			}
		}
		fmt.Fprintf(tw, "  %s\t%s@%d\t%s\t%s\t%s\t%s\n", p.RunID, p.Workflow, p.Version, p.Status, p.Verdict, at, p.Reason)
	}
	tw.Flush() //nolint:errcheck // stdout
	if listed := len(r.Problems); listed < r.Incompatible+r.Unregistered {
		fmt.Fprintf(e.stdout, "  ... and %d more (see --json)\n", r.Incompatible+r.Unregistered-listed)
	}
}
