package api_test

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/api"
	"github.com/ratchet-run/ratchet/engine"
)

// patience bounds each wait for the page: generous, since the browser,
// the server and Postgres share a machine that may be busy with more.
const patience = 30 * time.Second

// browser starts a headless Chromium for the test, or skips it, loudly,
// when the machine has none (.ci/run installs Debian's chromium).
func browser(t *testing.T) (context.Context, func() []string) {
	t.Helper()
	path := os.Getenv("RATCHET_CHROMIUM")
	if path == "" {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
			if p, err := exec.LookPath(name); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		t.Skip("SKIPPED: no Chromium on this machine, so the page at /ui/ is not tested in a browser: " +
			"install Debian's chromium (apt-get install chromium), or set RATCHET_CHROMIUM")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 3*patience)
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })

	var mu sync.Mutex
	var problems []string
	err := chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventExceptionThrown:
			problems = append(problems, "exception: "+e.ExceptionDetails.Text)
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeAssert {
				var args []string
				for _, a := range e.Args {
					args = append(args, string(a.Value))
				}
				problems = append(problems, "console."+string(e.Type)+": "+strings.Join(args, " "))
			}
		}
	})
	require.NoError(t, err, "start Chromium at %s", path)
	require.NoError(t, chromedp.Do(ctx), "start Chromium at %s", path)
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), problems...)
	}
}

func TestTheRunsPageInARealBrowser(t *testing.T) {
	t.Parallel()
	ctx, consoleProblems := browser(t)
	b := setup(t, &api.Config{Tokens: map[string]string{"tok": "default", "other": "acme"}})
	start := func(workflow, key, body string) string {
		r := b.start(t, workflow, key, body, "Authorization", "Bearer tok")
		require.Less(t, r.status, 500, "%s", r)
		got := decode[struct {
			ID    string `json:"id"`
			RunID string `json:"run_id"` // a failed run's problem
		}](t, r)
		return cmp.Or(got.ID, got.RunID)
	}
	start("echo", "e1", `{"value":"a"}`)
	napID := start("nap", "n1", `{"value":"parcel-7"}`)
	start("approval", "a1", `{"value":"tr_9"}`)
	declinedID := start("pay", "p1", `{"customer":"cus_declined","amount":5}`)
	chargeID := start("charge", "c1", `{"customer":"cus_1","amount":12}`)
	compensatedID := start("saga", "s1", `{"customer":"cus_closed","amount":5}`)
	approvalID := start("saga", "s2", `{"customer":"cus_2","amount":9}`)
	// A run executing (it waits for the test's release): answered once
	// claimed.
	r := b.start(t, "slow", "w1", `{"value":"x"}`, "Authorization", "Bearer tok", "Prefer", "wait=0")
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	runningID := decode[struct {
		ID string `json:"id"`
	}](t, r).ID
	// Two runs of one concurrency key: one holds its slot, one queues.
	queuedIDs := []string{}
	for _, key := range []string{"q1", "q2"} {
		r := b.start(t, "serial", key, `{"value":"acct_9"}`, "Authorization", "Bearer tok", "Prefer", "wait=0")
		require.Equal(t, http.StatusAccepted, r.status, "%s", r)
		queuedIDs = append(queuedIDs, decode[struct {
			ID string `json:"id"`
		}](t, r).ID)
	}
	// A run waiting in a queue.
	r = b.start(t, "echo", "in-queue", `{"value":"y"}`, "Authorization", "Bearer tok", "Ratchet-Queue", "outbound", "Ratchet-Priority", "4")
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	inQueueID := decode[struct {
		ID string `json:"id"`
	}](t, r).ID
	// A parent awaiting its child (two runs).
	r = b.start(t, "family", "fam-1", `{"value":"f"}`, "Authorization", "Bearer tok")
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	familyID := decode[struct {
		ID string `json:"id"`
	}](t, r).ID
	kids, err := b.engine.Children(context.Background(), familyID)
	require.NoError(t, err)
	require.Len(t, kids, 1)
	require.NoError(t, b.engine.Announce(context.Background(), time.Minute))
	const all = 13

	rows := func(sel string) int {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
		require.NoError(t, err)
		return n
	}
	// text and attr read the DOM in one evaluation: the page re-renders
	// as it polls, so a node found by one call may be gone by the next.
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ""`, sel)))
		require.NoError(t, err)
		return s
	}
	// click finds an element and clicks it in one evaluation, as soon as
	// it is there: a node chromedp.Click has found can be replaced by the
	// page's next render before the click lands (its node id is then
	// unknown), and the page re-renders every poll.
	click := func(sel string) {
		t.Helper()
		require.Eventually(t, func() bool {
			ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(
				`(() => { const el = document.querySelector(%q); if (!el) return false; el.click(); return true })()`, sel)))
			return err == nil && ok
		}, patience, 50*time.Millisecond, "click %s", sel)
	}
	// Without a token the API refuses, and the page says what to do.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.server.URL+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`#error`))))
	require.Contains(t, text(`#error`), "bearer token")

	// Another tenant's token sees none of these runs.
	require.NoError(t, chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS(`#token`), "other")))
	click(`#token-form button`)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#empty`))))

	require.NoError(t, chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS(`#token`), "tok")))
	click(`#token-form button`)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`tr.run-row`))))
	require.Equal(t, all, rows(`tr.run-row`))
	require.Equal(t, 1, rows(`tr.run-row[data-id="`+runningID+`"][data-status="running"][data-blocked="executing"]`))
	require.Equal(t, 1, rows(`tr.run-row[data-status="compensated"]`))
	require.Equal(t, 1, rows(`tr.run-row[data-status="failed"]`))

	// The blocked-reason filter offers every reason the engine decides.
	options, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("#filter-blocked option")].map((o) => o.value).filter(Boolean)`))
	require.NoError(t, err)
	var want []string
	for _, r := range engine.BlockedReasons() {
		want = append(want, string(r))
	}
	require.ElementsMatch(t, want, options)

	// Filters: waiting runs, then those blocked by a timer.
	require.NoError(t, chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS(`#filter-status`), "waiting")))
	click(`#apply`)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitNotPresent(chromedp.CSS(`tr.run-row[data-status="succeeded"]`))))
	require.Eventually(t, func() bool { return rows(`tr.run-row`) == 4 }, patience, 50*time.Millisecond)
	require.Equal(t, 4, rows(`tr.run-row[data-status="waiting"]`), "the family's parent among them")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS(`#filter-status`), ""),
		chromedp.SetValue(chromedp.CSS(`#filter-blocked`), "timer")))
	click(`#apply`)
	require.Eventually(t, func() bool { return rows(`tr.run-row`) == 1 && rows(`tr.run-row[data-id="`+napID+`"]`) == 1 }, patience, 50*time.Millisecond)

	// A run's page: what it waits for, its timeline, its input.
	click(`tr.run-row[data-id="` + napID + `"] a`)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#timeline`))))
	require.Equal(t, "timer", attr(t, ctx, `#why`, "data-reason"))
	require.Contains(t, text(`#input`), "parcel-7")
	require.Equal(t, 1, rows(`.phase-row[data-kind="wait"]`), "the wait is on the timeline")
	require.Equal(t, 1, rows(`.phase-row[data-kind="wait"] .tl-bar.wait`))

	// Cancel it with the button (a second click confirms).
	click(`#cancel`)
	click(`#cancel[data-armed="1"]`)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#why.none`))))
	require.Equal(t, "Cancelled.", text(`#action-result`))
	run, err := b.engine.GetRun(context.Background(), napID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, run.Status)

	// Filters by workflow, by idempotency key and by a step's child key.
	filter := func(field, want string) {
		t.Helper()
		_, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.hash = "#/"`))
		require.NoError(t, err)
		// The unfiltered list, in a form with nothing filled in.
		require.Eventually(t, func() bool {
			blank, err := chromedp.Run(ctx, chromedp.Evaluate[bool](
				`[...document.querySelectorAll("#filters input, #filters select")].every((el) => el.value === "")`))
			return err == nil && blank && rows(`tr.run-row`) == all
		}, patience, 50*time.Millisecond)
		require.NoError(t, chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS(`#filter-`+field), want)))
		click(`#apply`)
	}
	only := func(id string) func() bool {
		return func() bool { return rows(`tr.run-row`) == 1 && rows(`tr.run-row[data-id="`+id+`"]`) == 1 }
	}
	filter("workflow", "charge")
	require.Eventually(t, only(chargeID), patience, 50*time.Millisecond)
	filter("idempotency_key", "p1")
	require.Eventually(t, only(declinedID), patience, 50*time.Millisecond)
	phases, err := b.engine.Phases(context.Background(), chargeID)
	require.NoError(t, err)
	require.Len(t, phases, 1)
	filter("child_key", *phases[0].ChildKey)
	require.Eventually(t, only(chargeID), patience, 50*time.Millisecond)

	open := func(id string) {
		t.Helper()
		_, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.hash = "#/runs/`+id+`"`))
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			shown, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.getElementById("run-id") || {}).textContent || ""`))
			return err == nil && shown == id
		}, patience, 50*time.Millisecond)
	}

	// A step's page shows its child key on the timeline.
	open(chargeID)
	require.Contains(t, text(`.phase-row[data-kind="step"]`), *phases[0].ChildKey)

	// A queued run's page: its key, and the run holding the slot, a link
	// to it.
	open(queuedIDs[1])
	require.Eventually(t, func() bool { return attr(t, ctx, `#why`, "data-reason") == "concurrency" }, patience, 50*time.Millisecond)
	require.Contains(t, text(`#concurrency`), "serial/acct_9")
	require.Contains(t, text(`#concurrency`), "holds no slot")
	require.Equal(t, queuedIDs[0], text(`#holders a`))
	click(`#holders a`)
	require.Eventually(t, func() bool { return text(`#run-id`) == queuedIDs[0] }, patience, 50*time.Millisecond)
	require.Contains(t, text(`#concurrency`), "holds a slot")

	// A run waiting in a queue: the queue, its priority, why it waits.
	open(inQueueID)
	require.Eventually(t, func() bool { return attr(t, ctx, `#why`, "data-reason") == "queued" }, patience, 50*time.Millisecond)
	require.Contains(t, text(`#queue`), "outbound")
	require.Contains(t, text(`#queue`), "priority 4 · waiting in it")
	require.Contains(t, text(`#why`), "0 of its 1 running")

	// A parent's page links its child, awaiting it; the child's links back.
	open(familyID)
	require.Eventually(t, func() bool { return attr(t, ctx, `#why`, "data-reason") == "child" }, patience, 50*time.Millisecond)
	require.Equal(t, kids[0].ID, text(`#children a`))
	click(`#children a`)
	require.Eventually(t, func() bool { return text(`#run-id`) == kids[0].ID }, patience, 50*time.Millisecond)
	require.Equal(t, familyID, text(`#parent a`))

	// A compensated saga: the cause, the decision and each undo on the
	// timeline.
	open(compensatedID)
	require.Contains(t, text(`#run-error`), "account_closed")
	require.Equal(t, 2, rows(`.phase-row[data-kind="compensation"]`), "undo and undo:charged")
	require.Equal(t, 1, rows(`.phase-row[data-name="undo:charged"] .tl-bar.compensation`))

	// A run awaiting a signal: the button delivers it, and the run waits
	// for a worker; a worker's execution then replays the charge.
	open(approvalID)
	require.Equal(t, "signal", attr(t, ctx, `#why`, "data-reason"))
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS(`#signal-event`), "evt_ui_1"),
		chromedp.SetValue(chromedp.CSS(`#signal-payload`), `"yes"`)))
	// The page's next poll re-renders the run and keeps what was typed.
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`(window.beforePoll = document.getElementById("why")) !== null`))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rendered, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("why") !== window.beforePoll`))
		return err == nil && rendered
	}, patience, 50*time.Millisecond, "the run page re-renders as it polls")
	require.Equal(t, "evt_ui_1", value(t, ctx, `#signal-event`), "a re-render keeps what was typed")
	require.Equal(t, `"yes"`, value(t, ctx, `#signal-payload`))
	click(`#signal`)
	require.Eventually(t, func() bool { return text(`#action-result`) == "Signal delivered." }, patience, 50*time.Millisecond)
	require.Empty(t, value(t, ctx, `#signal-event`), "a sent signal's event id is not offered again")
	require.Eventually(t, func() bool { return attr(t, ctx, `#why`, "data-reason") == "due" }, patience, 50*time.Millisecond)
	run, err = b.engine.TakeOver(context.Background(), approvalID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	open(declinedID) // away and back: the page reloads the run
	open(approvalID)
	require.Equal(t, 1, rows(`.phase-row[data-name="charged"][data-replayed="1"]`), "the charge was replayed by the second execution")
	require.Equal(t, 1, rows(`.phase-row[data-name="ledger_posted"][data-replayed="0"]`))
	require.Contains(t, text(`.phase-row[data-name="charged"] .tl-meta`), "exec 1")
	require.Equal(t, "2, 0 failed", text(`#executions`), "woken by its signal: an execution, not a failure")

	// A failed run: its error, and Resume runs it again (the card is
	// still declined, so it fails again, in a second execution).
	open(declinedID)
	require.Contains(t, text(`#run-error`), "card_declined")
	click(`#resume`)
	require.Eventually(t, func() bool { return text(`#action-result`) == "Resumed." }, patience, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		run, err := b.engine.GetRun(context.Background(), declinedID)
		require.NoError(t, err)
		return run.Attempt == 2 && run.Status == engine.StatusFailed
	}, patience, 20*time.Millisecond)
	open(approvalID)
	open(declinedID)
	require.Equal(t, "2, 1 failed", text(`#executions`), "failures count afresh from a reopen")

	// The schedules page: a schedule put over the API, paused and
	// triggered with its buttons.
	put := b.do(t, http.MethodPut, "/v1/schedules/nightly", `{"cron": "0 2 * * *", "time_zone": "Europe/Paris", "workflow": "echo", "input": {"value": "nightly"}}`,
		"Authorization", "Bearer tok", "Content-Type", "application/json")
	require.Equal(t, http.StatusOK, put.status, "%s", put)
	click(`#nav-schedules`)
	require.Eventually(t, func() bool { return rows(`tr.schedule-row[data-name="nightly"][data-paused="0"]`) == 1 }, patience, 50*time.Millisecond)
	require.Contains(t, text(`tr.schedule-row[data-name="nightly"]`), "0 2 * * * (Europe/Paris)")
	click(`tr.schedule-row[data-name="nightly"] button.toggle`)
	require.Eventually(t, func() bool { return rows(`tr.schedule-row[data-name="nightly"][data-paused="1"]`) == 1 }, patience, 50*time.Millisecond)
	require.Equal(t, "Paused nightly.", text(`#schedule-result`))
	click(`tr.schedule-row[data-name="nightly"] button.trigger`)
	require.Eventually(t, func() bool { return strings.HasPrefix(text(`#schedule-result`), "Triggered nightly: run ") }, patience, 50*time.Millisecond)
	require.Contains(t, text(`#schedule-result`), "(succeeded)")
	require.Equal(t, 1, b.counter(t, "nightly"), "one run for the trigger")

	require.Empty(t, consoleProblems(), "no console errors or exceptions")
}

func TestThePageIsServedWithoutATokenAndItsDataIsNot(t *testing.T) {
	t.Parallel()
	b := setup(t, &api.Config{Tokens: map[string]string{"tok": "default"}})
	r := b.do(t, http.MethodGet, "/ui/", "")
	require.Equal(t, http.StatusOK, r.status)
	require.Contains(t, string(r.body), "<title>Ratchet runs</title>")
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/ui/app.js", "").status)
	require.Equal(t, http.StatusUnauthorized, b.do(t, http.MethodGet, "/v1/runs", "").status)
}

func attr(t *testing.T, ctx context.Context, sel, name string) string {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q) || {getAttribute: () => ""}).getAttribute(%q) || ""`, sel, name)))
	require.NoError(t, err)
	return v
}

func value(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q) || {}).value || ""`, sel)))
	require.NoError(t, err)
	return v
}
