package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"
)

// schedulesCmd groups the schedule commands, over the API.
type schedulesCmd struct {
	List    schedulesListCmd    `cmd:"" help:"List the schedules: timing, workflow, next tick, what they started."`
	Show    schedulesShowCmd    `cmd:"" help:"Show a schedule."`
	Put     schedulesPutCmd     `cmd:"" help:"Declare a schedule, or replace its declaration."`
	Pause   schedulesPauseCmd   `cmd:"" help:"Pause a schedule: it ticks no more until resumed."`
	Resume  schedulesResumeCmd  `cmd:"" help:"Resume a paused schedule; the ticks it missed go by its catch-up policy."`
	Trigger schedulesTriggerCmd `cmd:"" help:"Start a run of a schedule now, once per --key."`
	Delete  schedulesDeleteCmd  `cmd:"" help:"Delete a schedule; the runs it started stay."`
}

// scheduleJSON is what the CLI reads of a schedule.
type scheduleJSON struct {
	Name       string          `json:"name"`
	Cron       string          `json:"cron"`
	Every      float64         `json:"every"`
	TimeZone   string          `json:"time_zone"`
	Workflow   string          `json:"workflow"`
	Input      json.RawMessage `json:"input"`
	CatchUp    string          `json:"catch_up"`
	Overlap    string          `json:"overlap"`
	Source     string          `json:"source"`
	Paused     bool            `json:"paused"`
	NextTickAt time.Time       `json:"next_tick_at"`
	LastTickAt *time.Time      `json:"last_tick_at"`
	LastRunID  *string         `json:"last_run_id"`
	Started    int64           `json:"started"`
	Skipped    int64           `json:"skipped"`
}

func (s *scheduleJSON) timing() string {
	if s.Cron == "" {
		return "every " + (time.Duration(s.Every) * time.Second).String()
	}
	if s.TimeZone == "" {
		return s.Cron + " (UTC)"
	}
	return s.Cron + " (" + s.TimeZone + ")"
}

func (s *scheduleJSON) state() string {
	if s.Paused {
		return "paused"
	}
	return "next " + s.NextTickAt.UTC().Format(time.RFC3339)
}

func schedulePath(name string) string { return "/v1/schedules/" + url.PathEscape(name) }

type schedulesListCmd struct {
	apiFlags
	JSON bool `name:"json" help:"Print the API's answer as JSON."`
}

func (c *schedulesListCmd) Run(e *env) error {
	if c.JSON {
		return c.printRaw(e, "/v1/schedules")
	}
	var page struct {
		Data []scheduleJSON `json:"data"`
	}
	if err := c.call(e.ctx, http.MethodGet, "/v1/schedules", nil, nil, &page); err != nil {
		return err
	}
	if len(page.Data) == 0 {
		fmt.Fprintln(e.stdout, "no schedules")
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTIMING\tWORKFLOW\tSTATE\tSTARTED\tSKIPPED\tCATCH-UP\tOVERLAP\tSOURCE")
	for _, s := range page.Data {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", s.Name, s.timing(), s.Workflow, s.state(), s.Started, s.Skipped, s.CatchUp, s.Overlap, s.Source)
	}
	return tw.Flush()
}

type schedulesShowCmd struct {
	apiFlags
	Name string `arg:"" help:"The schedule's name."`
	JSON bool   `name:"json" help:"Print the API's answer as JSON."`
}

func (c *schedulesShowCmd) Run(e *env) error {
	if c.JSON {
		return c.printRaw(e, schedulePath(c.Name))
	}
	var s scheduleJSON
	if err := c.call(e.ctx, http.MethodGet, schedulePath(c.Name), nil, nil, &s); err != nil {
		return err
	}
	printSchedule(e, &s)
	return nil
}

func printSchedule(e *env, s *scheduleJSON) {
	fmt.Fprintf(e.stdout, "schedule %s  %s  starts %s with %s\n", s.Name, s.timing(), s.Workflow, s.Input)
	fmt.Fprintf(e.stdout, "%s; catch-up %s, overlap %s; declared by %s\n", s.state(), s.CatchUp, s.Overlap, s.Source)
	fmt.Fprintf(e.stdout, "started %d run(s), skipped %d tick(s)", s.Started, s.Skipped)
	if s.LastRunID != nil && s.LastTickAt != nil {
		fmt.Fprintf(e.stdout, "; the last, %s, for the tick of %s", *s.LastRunID, s.LastTickAt.UTC().Format(time.RFC3339))
	}
	fmt.Fprintln(e.stdout)
}

type schedulesPutCmd struct {
	apiFlags
	Name     string        `arg:"" help:"The schedule's name."`
	Cron     string        `name:"cron" help:"A five-field cron expression or @daily, @hourly, ..."`
	TimeZone string        `name:"time-zone" help:"The IANA time zone of --cron (default UTC)."`
	Every    time.Duration `name:"every" help:"A fixed interval instead of --cron (whole seconds)."`
	Workflow string        `name:"workflow" required:"" help:"The workflow each tick starts."`
	Input    string        `name:"input" default:"{}" help:"The workflow's JSON input."`
	CatchUp  string        `name:"catch-up" enum:"skip,one,all" default:"one" help:"Missed ticks: skip, one (the latest) or all."`
	Overlap  string        `name:"overlap" enum:"skip,buffer,allow" default:"skip" help:"A tick while the last run is unfinished: skip, buffer or allow."`
}

func (c *schedulesPutCmd) Run(e *env) error {
	if !json.Valid([]byte(c.Input)) {
		return fmt.Errorf("--input is not JSON: %s", c.Input)
	}
	if c.Every%time.Second != 0 {
		return fmt.Errorf("--every %s: want whole seconds", c.Every)
	}
	body, err := json.Marshal(map[string]any{"cron": c.Cron, "time_zone": c.TimeZone, "every": c.Every.Seconds(),
		"workflow": c.Workflow, "input": json.RawMessage(c.Input), "catch_up": c.CatchUp, "overlap": c.Overlap})
	if err != nil {
		return err
	}
	var s scheduleJSON
	if err := c.call(e.ctx, http.MethodPut, schedulePath(c.Name), nil, body, &s); err != nil {
		return err
	}
	printSchedule(e, &s)
	return nil
}

type schedulesPauseCmd struct {
	apiFlags
	Name string `arg:"" help:"The schedule's name."`
}

func (c *schedulesPauseCmd) Run(e *env) error {
	var s scheduleJSON
	if err := c.call(e.ctx, http.MethodPost, schedulePath(c.Name)+"/pause", nil, nil, &s); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s: paused\n", s.Name)
	return nil
}

type schedulesResumeCmd struct {
	apiFlags
	Name string `arg:"" help:"The schedule's name."`
}

func (c *schedulesResumeCmd) Run(e *env) error {
	var s scheduleJSON
	if err := c.call(e.ctx, http.MethodPost, schedulePath(c.Name)+"/resume", nil, nil, &s); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s: resumed, %s\n", s.Name, s.state())
	return nil
}

type schedulesTriggerCmd struct {
	apiFlags
	Name string `arg:"" help:"The schedule's name."`
	Key  string `name:"key" required:"" help:"The trigger's idempotency key: the same key starts one run however often it is sent."`
}

func (c *schedulesTriggerCmd) Run(e *env) error {
	var r runJSON
	if err := c.call(e.ctx, http.MethodPost, schedulePath(c.Name)+"/trigger", http.Header{"Idempotency-Key": {c.Key}}, nil, &r); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s: triggered run %s (%s)\n", c.Name, r.ID, r.Status)
	return nil
}

type schedulesDeleteCmd struct {
	apiFlags
	Name string `arg:"" help:"The schedule's name."`
}

func (c *schedulesDeleteCmd) Run(e *env) error {
	if err := c.call(e.ctx, http.MethodDelete, schedulePath(c.Name), nil, nil, nil); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s: deleted\n", c.Name)
	return nil
}
