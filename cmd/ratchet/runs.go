package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// runsCmd is "ratchet runs …": the operator's view of runs, over the API
// (as a person at 3 a.m. reaches a deployed service), with its tokens and
// tenancy.
type runsCmd struct {
	List   runsListCmd   `cmd:"" help:"List runs, newest first (filters, paging)."`
	Show   runsShowCmd   `cmd:"" help:"Show a run: its state, what it waits for, and its phases as a timeline."`
	Why    runsWhyCmd    `cmd:"" help:"Say what a run waits for and what will move it."`
	Cancel runsCancelCmd `cmd:"" help:"Cancel a run (it compensates what it did, if it registered undos)."`
	Resume runsResumeCmd `cmd:"" help:"Resume a failed run, or one parked for an operator."`
	Signal runsSignalCmd `cmd:"" help:"Send a signal to a run."`
}

// apiFlags say where the API is and how to authenticate.
type apiFlags struct {
	Server  string        `name:"server" env:"RATCHET_SERVER" default:"http://127.0.0.1:8080" help:"The Ratchet API's base URL (env RATCHET_SERVER)."`
	Token   string        `name:"token" env:"RATCHET_TOKEN" help:"Bearer token (env RATCHET_TOKEN)."`
	Timeout time.Duration `name:"timeout" default:"10s" help:"Bound on each request."`
}

// apiError is a problem the API answered, said in one line.
type apiError struct {
	status int
	code   string
	detail string
}

func (e *apiError) Error() string {
	switch e.status {
	case http.StatusUnauthorized:
		return "the server refused the token (401): set RATCHET_TOKEN or --token to one of its tokens"
	case http.StatusNotFound:
		if e.code == "run_not_found" {
			return "no such run (404): " + e.detail
		}
	}
	msg := fmt.Sprintf("the server answered %d %s", e.status, e.code)
	if e.detail != "" {
		msg += ": " + e.detail
	}
	return msg
}

// call sends a request to the API and decodes a 2xx answer into out (nil:
// discarded); a problem becomes an *apiError, an unreachable server one
// line saying so.
func (f *apiFlags) call(ctx context.Context, method, path string, header http.Header, body []byte, out any) error {
	ctx, cancel := context.WithTimeout(ctx, f.Timeout)
	defer cancel()
	base := strings.TrimRight(f.Server, "/")
	if u, err := url.Parse(base); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("bad --server %q: want http(s)://host:port", f.Server)
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if f.Token != "" {
		req.Header.Set("Authorization", "Bearer "+f.Token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		var opErr *net.OpError
		if errors.As(err, &opErr) {
			return fmt.Errorf("cannot reach the Ratchet API at %s: %v (is it running? set --server or RATCHET_SERVER)", base, opErr.Err)
		}
		return fmt.Errorf("cannot reach the Ratchet API at %s: %v", base, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("read the API's answer: %w", err)
	}
	if resp.StatusCode >= 300 {
		var p struct {
			Code   string `json:"code"`
			Title  string `json:"title"`
			Detail string `json:"detail"`
		}
		_ = json.Unmarshal(raw, &p)
		return &apiError{status: resp.StatusCode, code: p.Code, detail: cmpOr(p.Detail, p.Title)}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("the server's answer is not a Ratchet API's: %v", err)
	}
	return nil
}

func cmpOr(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// runJSON is what the CLI reads of a run resource.
type runJSON struct {
	ID              string          `json:"id"`
	Workflow        string          `json:"workflow"`
	WorkflowVersion int             `json:"workflow_version"`
	IdempotencyKey  string          `json:"idempotency_key"`
	Status          string          `json:"status"`
	RecoveryPoint   string          `json:"recovery_point"`
	Attempt         int             `json:"attempt"`
	Failures        int             `json:"failures"`
	Output          json.RawMessage `json:"output"`
	Error           *errorJSON      `json:"error"`
	Blocked         *blockedJSON    `json:"blocked"`
	Concurrency     *struct {
		Key       string `json:"key"`
		Limit     int    `json:"limit"`
		HoldsSlot bool   `json:"holds_slot"`
	} `json:"concurrency"`
	Queue *struct {
		Name      string     `json:"name"`
		Priority  int        `json:"priority"`
		StartedAt *time.Time `json:"started_at"`
	} `json:"queue"`
	ParentRunID *string `json:"parent_run_id"`
	Children    []struct {
		ID       string `json:"id"`
		Workflow string `json:"workflow"`
		Status   string `json:"status"`
	} `json:"children"`
	Cancellation      string      `json:"cancellation"`
	CreatedAt         time.Time   `json:"created_at"`
	UpdatedAt         time.Time   `json:"updated_at"`
	FinishedAt        *time.Time  `json:"finished_at"`
	CancelRequestedAt *time.Time  `json:"cancel_requested_at"`
	Phases            []phaseJSON `json:"phases"`
}

type errorJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type blockedJSON struct {
	Reason  string     `json:"reason"`
	Detail  string     `json:"detail"`
	Since   *time.Time `json:"since"`
	Until   *time.Time `json:"until"`
	Holders []string   `json:"holders"`
}

type phaseJSON struct {
	Seq        int        `json:"seq"`
	Name       string     `json:"name"`
	Kind       string     `json:"kind"`
	Status     string     `json:"status"`
	ChildKey   *string    `json:"child_key"`
	Attempts   int        `json:"attempts"`
	Error      *errorJSON `json:"error"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt time.Time  `json:"finished_at"`
	Execution  int        `json:"execution"`
	Replayed   bool       `json:"replayed"`
}

func runPath(id string) string { return "/v1/runs/" + url.PathEscape(id) }

type runsListCmd struct {
	apiFlags
	Status   string `name:"status" help:"Only runs in this status."`
	Workflow string `name:"workflow" help:"Only runs of this workflow."`
	Blocked  string `name:"blocked" help:"Only unfinished runs blocked for this reason (executing, due, backing_off, timer, signal, ...)."`
	Key      string `name:"key" help:"The run started with this idempotency key."`
	ChildKey string `name:"child-key" help:"The run whose step sent this child key downstream."`
	Limit    int    `name:"limit" default:"20" help:"Runs per page (1..500)."`
	After    string `name:"after" help:"Continue after this run id (the previous page's last)."`
	JSON     bool   `name:"json" help:"Print the API's page as JSON."`
}

func (c *runsListCmd) Run(e *env) error {
	q := url.Values{}
	for k, v := range map[string]string{"status": c.Status, "workflow": c.Workflow, "blocked": c.Blocked,
		"idempotency_key": c.Key, "child_key": c.ChildKey, "after": c.After} {
		if v != "" {
			q.Set(k, v)
		}
	}
	q.Set("limit", fmt.Sprint(c.Limit))
	if c.JSON {
		return c.printRaw(e, "/v1/runs?"+q.Encode())
	}
	var page struct {
		Data []runJSON `json:"data"`
		Next *string   `json:"next"`
	}
	if err := c.call(e.ctx, http.MethodGet, "/v1/runs?"+q.Encode(), nil, nil, &page); err != nil {
		return err
	}
	if len(page.Data) == 0 {
		fmt.Fprintln(e.stdout, "no runs")
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tWORKFLOW\tSTATUS\tBLOCKED\tKEY\tCREATED\tAGE")
	for _, r := range page.Data {
		blocked := "-"
		if r.Blocked != nil {
			blocked = r.Blocked.Reason
		}
		fmt.Fprintf(tw, "%s\t%s@%d\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Workflow, r.WorkflowVersion, r.Status, blocked,
			r.IdempotencyKey, r.CreatedAt.UTC().Format(time.RFC3339), ago(r.CreatedAt))
	}
	tw.Flush() //nolint:errcheck // stdout
	if page.Next != nil {
		fmt.Fprintf(e.stdout, "more: --after %s\n", *page.Next)
	}
	return nil
}

type runsShowCmd struct {
	apiFlags
	ID   string `arg:"" help:"The run's id."`
	JSON bool   `name:"json" help:"Print the API's run resource as JSON."`
}

func (c *runsShowCmd) Run(e *env) error {
	if c.JSON {
		return c.printRaw(e, runPath(c.ID))
	}
	var r runJSON
	if err := c.call(e.ctx, http.MethodGet, runPath(c.ID), nil, nil, &r); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "run %s  %s@%d  key %s\n", r.ID, r.Workflow, r.WorkflowVersion, r.IdempotencyKey)
	fmt.Fprintf(e.stdout, "status %s, %s, recovery point %s, created %s\n", r.Status, executions(r.Attempt, r.Failures), r.RecoveryPoint, r.CreatedAt.UTC().Format(time.RFC3339))
	if c := r.Concurrency; c != nil {
		slot := "holds no slot"
		if c.HoldsSlot {
			slot = "holds a slot"
		}
		fmt.Fprintf(e.stdout, "concurrency key %s, limit %d, %s\n", c.Key, c.Limit, slot)
	}
	if q := r.Queue; q != nil {
		state := "waiting in it"
		if q.StartedAt != nil {
			state = "started from it " + q.StartedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(e.stdout, "queue %s, priority %d, %s\n", q.Name, q.Priority, state)
	}
	if r.ParentRunID != nil {
		fmt.Fprintf(e.stdout, "child of run %s\n", *r.ParentRunID)
	}
	for _, c := range r.Children {
		fmt.Fprintf(e.stdout, "child run %s  %s  %s\n", c.ID, c.Workflow, c.Status)
	}
	printWhy(e, &r)
	if r.Error != nil {
		fmt.Fprintf(e.stdout, "error %s: %s\n", r.Error.Code, r.Error.Message)
	}
	if len(r.Output) > 0 && string(r.Output) != "null" {
		fmt.Fprintf(e.stdout, "output %s\n", r.Output)
	}
	if len(r.Phases) == 0 {
		fmt.Fprintln(e.stdout, "no phase committed yet")
		return nil
	}
	fmt.Fprintln(e.stdout, "timeline (from the run's creation):")
	tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  #\tPHASE\tKIND\tSTATUS\tAT\tTOOK\tATTEMPTS\tEXECUTION\tCHILD KEY")
	for _, p := range r.Phases {
		key := "-"
		if p.ChildKey != nil {
			key = *p.ChildKey
		}
		status := p.Status
		if p.Error != nil {
			status += " (" + p.Error.Code + ")"
		}
		// The execution that committed the phase; later ones replayed it.
		exec := "-"
		if p.Execution > 0 {
			exec = strconv.Itoa(p.Execution)
			if p.Replayed {
				exec += " (replayed since)"
			}
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t+%s\t%s\t%d\t%s\t%s\n", p.Seq, p.Name, p.Kind, status,
			p.StartedAt.Sub(r.CreatedAt).Round(time.Millisecond), p.FinishedAt.Sub(p.StartedAt).Round(time.Millisecond), p.Attempts, exec, key)
	}
	tw.Flush() //nolint:errcheck // stdout
	return nil
}

type runsWhyCmd struct {
	apiFlags
	ID string `arg:"" help:"The run's id."`
}

func (c *runsWhyCmd) Run(e *env) error {
	var r runJSON
	if err := c.call(e.ctx, http.MethodGet, runPath(c.ID), nil, nil, &r); err != nil {
		return err
	}
	printWhy(e, &r)
	return nil
}

// printWhy says what the run waits for, or that it has finished.
func printWhy(e *env, r *runJSON) {
	if r.Blocked == nil {
		fmt.Fprintf(e.stdout, "%s: finished %s; nothing moves it any more\n", r.ID, r.Status)
		return
	}
	b := r.Blocked
	line := fmt.Sprintf("%s: %s — %s", r.ID, b.Reason, b.Detail)
	if b.Since != nil && b.Since.Before(time.Now()) {
		line += fmt.Sprintf(" (since %s, %s ago)", b.Since.UTC().Format(time.RFC3339), ago(*b.Since))
	}
	fmt.Fprintln(e.stdout, line)
	if len(b.Holders) > 0 {
		fmt.Fprintf(e.stdout, "  the key's slots are held by %s\n", strings.Join(b.Holders, ", "))
	}
}

type runsCancelCmd struct {
	apiFlags
	ID string `arg:"" help:"The run's id."`
}

func (c *runsCancelCmd) Run(e *env) error {
	var r runJSON
	if err := c.call(e.ctx, http.MethodPost, runPath(c.ID)+"/cancel", nil, nil, &r); err != nil {
		return err
	}
	switch r.Cancellation {
	case "cancelled":
		fmt.Fprintf(e.stdout, "%s: cancelled\n", r.ID)
	case "compensates":
		fmt.Fprintf(e.stdout, "%s: cancelling; it undoes what it did (compensates) first\n", r.ID)
	default:
		fmt.Fprintf(e.stdout, "%s: cancellation requested; the executor holding it stops at its next phase boundary\n", r.ID)
	}
	return nil
}

type runsResumeCmd struct {
	apiFlags
	ID string `arg:"" help:"The run's id."`
}

func (c *runsResumeCmd) Run(e *env) error {
	var r runJSON
	if err := c.call(e.ctx, http.MethodPost, runPath(c.ID)+"/resume", nil, nil, &r); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s: resumed (%s)\n", r.ID, r.Status)
	return nil
}

type runsSignalCmd struct {
	apiFlags
	ID      string `arg:"" help:"The run's id."`
	Name    string `arg:"" help:"The signal's name, as the workflow awaits it."`
	EventID string `name:"event-id" required:"" help:"The signal's own idempotency key (the provider's event id)."`
	Payload string `name:"payload" default:"{}" help:"The signal's JSON payload."`
}

func (c *runsSignalCmd) Run(e *env) error {
	if !json.Valid([]byte(c.Payload)) {
		return fmt.Errorf("--payload is not JSON: %s", c.Payload)
	}
	var s struct {
		Delivered bool `json:"delivered"`
	}
	err := c.call(e.ctx, http.MethodPost, runPath(c.ID)+"/signals/"+url.PathEscape(c.Name),
		http.Header{"Idempotency-Key": {c.EventID}}, []byte(c.Payload), &s)
	if err != nil {
		return err
	}
	if s.Delivered {
		fmt.Fprintf(e.stdout, "%s: signal %s delivered\n", c.ID, c.Name)
	} else {
		fmt.Fprintf(e.stdout, "%s: signal %s kept until the run awaits it\n", c.ID, c.Name)
	}
	return nil
}

// printRaw prints the API's JSON answer to a GET of path, indented.
func (f *apiFlags) printRaw(e *env, path string) error {
	var raw json.RawMessage
	if err := f.call(e.ctx, http.MethodGet, path, nil, nil, &raw); err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "", "  "); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, out.String())
	return nil
}

// ago is a duration since t, rounded for a person.
func ago(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return d.Round(time.Minute).String()
	}
	return d.Round(time.Hour).String()
}

// executions says how many times a run was executed and how many of those
// failed: "3 executions, 1 failed".
func executions(attempt, failures int) string {
	s := "executions"
	if attempt == 1 {
		s = "execution"
	}
	return fmt.Sprintf("%d %s, %d failed", attempt, s, failures)
}
