package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/api"
	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/testdb"
	"github.com/ratchet-run/ratchet/steps"
)

// opsServer is a real API over a test database, with runs in several
// states, for the runs commands to talk to.
type opsServer struct {
	url    string
	engine *engine.Client
	ids    map[string]string // by idempotency key
}

func startOpsServer(t *testing.T) *opsServer {
	t.Helper()
	pool := testdb.New(t, nil)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "order", func(ctx context.Context, in string) (string, error) {
		if _, err := engine.Atomic(ctx, "reserved", func(context.Context, pgx.Tx) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		switch in {
		case "declined":
			return "", steps.Permanent("card_declined", errors.New("declined"))
		case "flaky":
			return "", errors.New("the ledger is down")
		case "approval":
			return engine.Await[string](ctx, "approved", nil)
		}
		return "shipped", nil
	}, &engine.WorkflowOpts{Retry: &engine.RetryPolicy{InitialInterval: time.Hour, MaxInterval: time.Hour}})
	require.NoError(t, err)
	// One at a time: a run parks holding the slot, the next queues.
	_, err = engine.Register(workflows, "serial", func(ctx context.Context, _ string) (string, error) {
		return engine.Await[string](ctx, "approved", nil)
	}, &engine.WorkflowOpts{Concurrency: &engine.Concurrency{Limit: 1}})
	require.NoError(t, err)
	// "family" starts an order as its child and awaits it.
	_, err = engine.Register(workflows, "family", func(ctx context.Context, in string) (string, error) {
		return engine.Child[string](ctx, "kid", "order", in, nil)
	}, nil)
	require.NoError(t, err)
	c, err := engine.NewClient(pool, &engine.Config{Workflows: workflows, Queues: []engine.Queue{{Name: "ops", Concurrency: 1}}})
	require.NoError(t, err)
	h, err := api.New(&api.Config{Engine: c, Tokens: map[string]string{"s3cret": "default"}})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s := &opsServer{url: srv.URL, engine: c, ids: map[string]string{}}
	require.NoError(t, c.Announce(context.Background(), time.Minute)) // as its worker would
	for _, in := range []string{"fine", "declined", "flaky", "approval", "approval2"} {
		input := in
		if in == "approval2" {
			input = "approval"
		}
		raw, _ := json.Marshal(input)
		res, err := c.Start(context.Background(), engine.StartParams{Workflow: "order", IdempotencyKey: in, Input: raw})
		require.NoError(t, err)
		s.ids[in] = res.Run.ID
	}
	return s
}

func (s *opsServer) runs(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Main(context.Background(), append(append([]string{"runs"}, args...), "--server", s.url, "--token", "s3cret"), &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestRunsCommandsAgainstARealServer(t *testing.T) {
	t.Parallel()
	s := startOpsServer(t)

	out, errOut, code := s.runs(t, "list")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "ID")
	for key := range s.ids {
		require.Contains(t, out, s.ids[key])
	}
	out, _, code = s.runs(t, "list", "--blocked", "signal")
	require.Equal(t, 0, code)
	require.Contains(t, out, s.ids["approval"])
	require.NotContains(t, out, s.ids["fine"])
	out, _, code = s.runs(t, "list", "--status", "failed", "--json")
	require.Equal(t, 0, code)
	var page struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	require.Len(t, page.Data, 1)
	require.Equal(t, s.ids["declined"], page.Data[0].ID)
	out, _, code = s.runs(t, "list", "--limit", "2")
	require.Equal(t, 0, code)
	require.Contains(t, out, "more: --after ")

	out, _, code = s.runs(t, "show", s.ids["approval"])
	require.Equal(t, 0, code)
	require.Contains(t, out, "status waiting, 1 execution, 0 failed")
	require.Contains(t, out, "signal — awaiting signal \"approved\"")
	require.Contains(t, out, "timeline (from the run's creation):")
	require.Contains(t, out, "reserved")

	out, _, code = s.runs(t, "why", s.ids["flaky"])
	require.Equal(t, 0, code)
	require.Contains(t, out, "backing_off — failed retryably (internal, 1 time(s) in a row)")
	out, _, code = s.runs(t, "why", s.ids["fine"])
	require.Equal(t, 0, code)
	require.Contains(t, out, "finished succeeded")

	out, _, code = s.runs(t, "signal", s.ids["approval"], "approved", "--event-id", "evt_1", "--payload", `"ops"`)
	require.Equal(t, 0, code)
	require.Contains(t, out, "signal approved delivered")
	out, _, code = s.runs(t, "why", s.ids["approval"])
	require.Equal(t, 0, code)
	require.Contains(t, out, "due — due, and no worker has taken it", "woken by the signal; this server has no worker")
	run, err := s.engine.TakeOver(context.Background(), s.ids["approval"]) // as a worker would
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	out, _, code = s.runs(t, "show", s.ids["approval"])
	require.Equal(t, 0, code)
	require.Regexp(t, `reserved\s+atomic\s+committed.*\s1 \(replayed since\)`, out, "committed by the first execution, replayed by the second")
	require.Regexp(t, `approved\s+signal\s+committed.*\s2\s`, out)

	out, _, code = s.runs(t, "cancel", s.ids["approval2"])
	require.Equal(t, 0, code)
	require.Contains(t, out, ": cancelled")
	out, _, code = s.runs(t, "resume", s.ids["declined"])
	require.Equal(t, 0, code)
	require.Contains(t, out, "resumed")
}

func TestRunsShowAndWhyNameAConcurrencyKeyAndItsHoldersOrAQueue(t *testing.T) {
	t.Parallel()
	s := startOpsServer(t)
	ctx := context.Background()
	start := func(key string) string {
		res, err := s.engine.Start(ctx, engine.StartParams{Workflow: "serial", IdempotencyKey: key, Input: []byte(`""`)})
		require.NoError(t, err)
		return res.Run.ID
	}
	holder, queued := start("serial-1"), start("serial-2")

	out, errOut, code := s.runs(t, "show", holder)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "concurrency key serial, limit 1, holds a slot")
	out, _, code = s.runs(t, "show", queued)
	require.Equal(t, 0, code)
	require.Contains(t, out, "concurrency key serial, limit 1, holds no slot")
	out, _, code = s.runs(t, "why", queued)
	require.Equal(t, 0, code)
	require.Contains(t, out, queued+`: concurrency — queued for a slot of concurrency key "serial" (limit 1)`)
	require.Contains(t, out, "the key's slots are held by "+holder)
	out, _, code = s.runs(t, "list", "--blocked", "concurrency")
	require.Equal(t, 0, code)
	require.Contains(t, out, queued)
	require.NotContains(t, out, holder)

	res, err := s.engine.Start(ctx, engine.StartParams{Workflow: "order", IdempotencyKey: "in-queue", Input: []byte(`"fine"`), StartOpts: engine.StartOpts{Queue: "ops", Priority: 2}})
	require.NoError(t, err)
	out, _, code = s.runs(t, "show", res.Run.ID)
	require.Equal(t, 0, code)
	require.Contains(t, out, "queue ops, priority 2, waiting in it")
	out, _, code = s.runs(t, "why", res.Run.ID)
	require.Equal(t, 0, code)
	require.Contains(t, out, res.Run.ID+`: queued — waiting in queue "ops" (priority 2)`)
	require.Contains(t, out, "0 of its 1 running, 0 waiting ahead of this run")

	fam, err := s.engine.Start(ctx, engine.StartParams{Workflow: "family", IdempotencyKey: "family-1", Input: []byte(`"fine"`)})
	require.NoError(t, err)
	kids, err := s.engine.Children(ctx, fam.Run.ID)
	require.NoError(t, err)
	require.Len(t, kids, 1)
	out, _, code = s.runs(t, "show", fam.Run.ID)
	require.Equal(t, 0, code)
	require.Contains(t, out, "child run "+kids[0].ID+"  order  pending")
	out, _, code = s.runs(t, "why", fam.Run.ID)
	require.Equal(t, 0, code)
	require.Contains(t, out, fam.Run.ID+": child — awaiting child run "+kids[0].ID+" at kid.done")
	out, _, code = s.runs(t, "show", kids[0].ID)
	require.Equal(t, 0, code)
	require.Contains(t, out, "child of run "+fam.Run.ID)
}

func TestRunsCommandsSayWhatWentWrongInOneLine(t *testing.T) {
	t.Parallel()
	s := startOpsServer(t)
	_, errOut, code := s.runs(t, "show", "01KAAAAAAAAAAAAAAAAAAAAAAA")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "no such run (404)")

	var out, stderr bytes.Buffer
	code = Main(context.Background(), []string{"runs", "list", "--server", s.url, "--token", "wrong"}, &out, &stderr)
	require.Equal(t, 1, code)
	require.Contains(t, stderr.String(), "the server refused the token (401)")

	stderr.Reset()
	code = Main(context.Background(), []string{"runs", "list", "--server", "http://127.0.0.1:1"}, &out, &stderr)
	require.Equal(t, 1, code)
	require.Contains(t, stderr.String(), "cannot reach the Ratchet API at http://127.0.0.1:1")

	_, errOut, code = s.runs(t, "cancel", s.ids["fine"])
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "409 run_finished")
	require.Equal(t, 1, strings.Count(strings.TrimSpace(errOut), "\n")+1, "one line")
	_, errOut, code = s.runs(t, "list", "--blocked", "bored")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "400 invalid_query")
}
