package api_test

import (
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
	ctx, cancelTimeout := context.WithTimeout(ctx, 60*time.Second)
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
		return decode[struct {
			ID    string `json:"id"`
			RunID string `json:"run_id"` // a failed run's problem
		}](t, r).ID
	}
	start("echo", "e1", `{"value":"a"}`)
	napID := start("nap", "n1", `{"value":"parcel-7"}`)
	start("approval", "a1", `{"value":"tr_9"}`)
	start("pay", "p1", `{"customer":"cus_declined","amount":5}`)
	require.NoError(t, b.engine.Announce(context.Background(), time.Minute))

	rows := func(sel string) int {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
		require.NoError(t, err)
		return n
	}
	// Without a token the API refuses, and the page says what to do.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.server.URL+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`#error`))))
	notice, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#error`)))
	require.NoError(t, err)
	require.Contains(t, notice, "bearer token")

	// Another tenant's token sees none of these runs.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS(`#token`), "other"),
		chromedp.Click(chromedp.CSS(`#token-form button`)),
		chromedp.WaitVisible(chromedp.CSS(`#empty`))))

	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS(`#token`), "tok"),
		chromedp.Click(chromedp.CSS(`#token-form button`)),
		chromedp.WaitVisible(chromedp.CSS(`tr.run-row`))))
	require.Equal(t, 4, rows(`tr.run-row`))

	// Filters: waiting runs, then those blocked by a timer.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS(`#filter-status`), "waiting"),
		chromedp.Click(chromedp.CSS(`#apply`)),
		chromedp.WaitNotPresent(chromedp.CSS(`tr.run-row[data-status="succeeded"]`))))
	require.Eventually(t, func() bool { return rows(`tr.run-row`) == 2 }, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, 2, rows(`tr.run-row[data-status="waiting"]`))
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS(`#filter-status`), ""),
		chromedp.SetValue(chromedp.CSS(`#filter-blocked`), "timer"),
		chromedp.Click(chromedp.CSS(`#apply`))))
	require.Eventually(t, func() bool { return rows(`tr.run-row`) == 1 && rows(`tr.run-row[data-id="`+napID+`"]`) == 1 }, 10*time.Second, 50*time.Millisecond)

	// A run's page: what it waits for, its timeline, its input.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`tr.run-row[data-id="`+napID+`"] a`)),
		chromedp.WaitVisible(chromedp.CSS(`#timeline`))))
	reason, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(`#why`), "data-reason"))
	require.NoError(t, err)
	input, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#input`)))
	require.NoError(t, err)
	require.Equal(t, "timer", reason.Value)
	require.Contains(t, input, "parcel-7")
	require.Equal(t, 1, rows(`.phase-row[data-kind="wait"]`), "the wait is on the timeline")
	require.Equal(t, 1, rows(`.phase-row[data-kind="wait"] .tl-bar.wait`))

	// Cancel it with the button (a second click confirms).
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`#cancel`)),
		chromedp.WaitVisible(chromedp.CSS(`#cancel[data-armed="1"]`)),
		chromedp.Click(chromedp.CSS(`#cancel`)),
		chromedp.WaitVisible(chromedp.CSS(`#why.none`))))
	result, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#action-result`)))
	require.NoError(t, err)
	require.Equal(t, "Cancelled.", result)
	run, err := b.engine.GetRun(context.Background(), napID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, run.Status)

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
