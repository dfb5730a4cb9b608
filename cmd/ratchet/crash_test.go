package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/testdb"
)

// crashBinary is the command built once with crash points compiled in,
// for every test of the package: a build is the costliest thing they do,
// and the suite's timed recovery tests run beside them.
var crashBinary struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if crashBinary.dir != "" {
		os.RemoveAll(crashBinary.dir)
	}
	os.Exit(code)
}

// buildCrashBinary returns the command with crash points compiled in.
func buildCrashBinary(t *testing.T) string {
	t.Helper()
	crashBinary.once.Do(func() {
		if crashBinary.dir, crashBinary.err = os.MkdirTemp("", "ratchet-crash"); crashBinary.err != nil {
			return
		}
		crashBinary.path = filepath.Join(crashBinary.dir, "ratchet")
		out, err := exec.Command("go", "build", "-tags", "crashpoints", "-o", crashBinary.path, ".").CombinedOutput()
		if err != nil {
			crashBinary.err = fmt.Errorf("%w: %s", err, out)
		}
	})
	require.NoError(t, crashBinary.err)
	return crashBinary.path
}

// service is a ratchet process seen from the test.
type service struct {
	cmd    *exec.Cmd
	base   string
	stderr *bytes.Buffer
	exited chan struct{}
}

// startService runs bin with args and env, and waits for its API address.
func startService(t *testing.T, bin string, env []string, args ...string) *service {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	s := &service{cmd: cmd, stderr: &bytes.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = s.stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "ratchet API listening on "); ok {
				addr <- strings.Fields(rest)[0]
			}
		}
		_ = cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-s.exited
	})
	select {
	case s.base = <-addr:
	case <-s.exited:
		t.Fatalf("%v exited: %s", args, s.stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("%v did not start", args)
	}
	return s
}

// card is the payment the crash matrix sends.
const card = `{"amount": 1299, "currency": "usd", "customer": "cus_123", "email": "a@example.com"}`

// TestCrashMatrix kills the service process (API and worker, as deployed)
// executing payments at every phase boundary and in the middle of the
// charge, while its clients retry with the same key — ten retries each, at
// once — against a second process. Every
// payment must end succeeded, charged once, posted once (two ledger rows
// summing to zero) and receipted once.
func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	perPoint := crashPayments(20)
	bin := buildCrashBinary(t)
	url := testdb.NewURL(t)

	var midCharge atomic.Pointer[os.Process] // killed by the gateway once it has charged
	gateway := fakes.NewGateway(&fakes.GatewayOpts{AfterCharge: kill(&midCharge)})
	mail := fakes.NewMail(nil)
	gwSrv, mailSrv := httptest.NewServer(gateway), httptest.NewServer(mail)
	defer gwSrv.Close()
	defer mailSrv.Close()
	env := []string{"DATABASE_URL=" + smallPool(url), "RATCHET_GATEWAY_URL=" + gwSrv.URL, "RATCHET_MAIL_URL=" + mailSrv.URL, "RATCHET_STALE_AFTER=2s"}

	survivor := startService(t, bin, env, "serve", "--addr", "127.0.0.1:0")
	client := &http.Client{Timeout: 30 * time.Second}
	var (
		mu          sync.Mutex
		serverError []string
		keys        []string
	)
	// start:ledger_posted kills the process while it holds the charge's
	// result, which commits with the ledger's transaction: the charge is
	// repeated with its key.
	points := []string{"start:payment_created", "end:payment_created", "mid-charge", "end:charge_created", "start:ledger_posted", "end:ledger_posted"}
	for _, point := range points {
		victimEnv := env
		if point != "mid-charge" {
			victimEnv = append(victimEnv, "RATCHET_CRASH_AT="+point)
		}
		victim := startService(t, bin, victimEnv, "serve", "--addr", "127.0.0.1:0") // as deployed: API and worker
		if point == "mid-charge" {
			midCharge.Store(victim.cmd.Process)
		}
		var wg sync.WaitGroup
		for i := range perPoint {
			key := fmt.Sprintf("crash-%s-%d", point, i)
			keys = append(keys, key)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r := post(client, runsURL(victim.base, "payment"), key, card); r.err == nil && r.status == http.StatusCreated {
					return // finished before the crash
				}
				// The storm: ten retries at once against the other process.
				var storm sync.WaitGroup
				for range 10 {
					storm.Add(1)
					go func() {
						defer storm.Done()
						if r := post(client, runsURL(survivor.base, "payment"), key, card); r.status >= 500 {
							mu.Lock()
							serverError = append(serverError, fmt.Sprintf("%s: %d", key, r.status))
							mu.Unlock()
						}
					}()
				}
				storm.Wait()
				// Then a patient client, until the payment is final.
				retryUntil(client, runsURL(survivor.base, "payment"), key, card, func(r postResult) bool { return r.status == http.StatusCreated }, func(problem string) {
					mu.Lock()
					serverError = append(serverError, problem)
					mu.Unlock()
				})
			}()
		}
		wg.Wait()
		select {
		case <-victim.exited:
			ws := victim.cmd.ProcessState.Sys().(syscall.WaitStatus)
			require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "%s: the victim died of SIGKILL, not %v", point, victim.cmd.ProcessState)
		case <-time.After(10 * time.Second):
			_ = victim.cmd.Process.Kill()
			<-victim.exited // its log is complete, and no longer written
			t.Fatalf("%s: the victim was never killed; its log:\n%s", point, victim.stderr)
		}
	}
	require.Empty(t, serverError)

	total := len(keys)
	require.Eventually(t, func() bool { return len(mail.Stats().DeliveriesByMessageID) >= total }, 60*time.Second, 50*time.Millisecond, "a receipt for every payment") // by message id: resends must not count
	pool := testdb.Connect(t, url, nil)
	ctx := context.Background()
	var succeeded, ledgerRows, ledgerSum, paymentsWithTwoRows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM payments.payments WHERE status = 'succeeded'`).Scan(&succeeded))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount), 0) FROM payments.ledger_entries`).Scan(&ledgerRows, &ledgerSum))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT payment_id FROM payments.ledger_entries GROUP BY 1 HAVING count(*) = 2) p`).Scan(&paymentsWithTwoRows))
	var runsSucceeded int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs WHERE workflow = 'payment' AND status = 'succeeded'`).Scan(&runsSucceeded))

	require.Equal(t, total, runsSucceeded, "every payment ends succeeded")
	require.Equal(t, total, succeeded)
	stats := gateway.Stats()
	require.Equal(t, total, stats.Charges, "one charge per payment")
	require.Len(t, stats.ChargesByKey, total)
	require.Equal(t, 2*total, ledgerRows)
	require.Equal(t, total, paymentsWithTwoRows, "two ledger rows per payment")
	require.Zero(t, ledgerSum, "the ledger sums to zero")
	m := mail.Stats()
	// One receipt per payment, by message id. A process killed between a
	// receipt's send and its record sends it again with the same message
	// id (the outbox's documented duplicate, which the mail service
	// deduplicates): a kill aimed at a payment's phase can land there.
	require.Len(t, m.DeliveriesByMessageID, total, "one receipt per payment")
	require.GreaterOrEqual(t, m.Deliveries, total)
	if resent := m.Deliveries - total; resent > 0 {
		t.Logf("%d receipt(s) sent again with the same message id after a kill mid-delivery", resent)
	}
	t.Logf("%d payments over %d crash points: %d charges, %d ledger rows, %d receipts; gateway saw %d requests",
		total, len(points), stats.Charges, ledgerRows, m.Deliveries, len(gateway.Requests()))
}

// TestCompensationCrashMatrix kills the service process (API and worker)
// running payments that the ledger refuses after the charge, at every
// boundary of the compensation and in the middle of the refund, while
// their clients retry against a second process. Every payment must end
// compensated: charged once, refunded once under the refund's own key,
// never posted.
func TestCompensationCrashMatrix(t *testing.T) {
	t.Parallel()
	perPoint := crashPayments(5)
	bin := buildCrashBinary(t)
	url := testdb.NewURL(t)

	var midRefund atomic.Pointer[os.Process] // killed by the gateway once it has refunded
	gateway := fakes.NewGateway(&fakes.GatewayOpts{AfterRefund: kill(&midRefund)})
	gwSrv, mailSrv := httptest.NewServer(gateway), httptest.NewServer(fakes.NewMail(nil))
	defer gwSrv.Close()
	defer mailSrv.Close()
	env := []string{"DATABASE_URL=" + smallPool(url), "RATCHET_GATEWAY_URL=" + gwSrv.URL, "RATCHET_MAIL_URL=" + mailSrv.URL, "RATCHET_STALE_AFTER=2s"}

	survivor := startService(t, bin, env, "serve", "--addr", "127.0.0.1:0")
	pool := testdb.Connect(t, url, nil)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO payments.closed_accounts (customer) VALUES ('cus_closed')`)
	require.NoError(t, err)

	client := &http.Client{Timeout: 30 * time.Second}
	const body = `{"amount": 1299, "currency": "usd", "customer": "cus_closed", "email": "a@example.com"}`
	var (
		mu       sync.Mutex
		problems []string
		total    int
	)
	points := []string{"end:charge_created", "end:payment_refused", "end:undo", "mid-refund", "end:undo:charge_created"}
	for _, point := range points {
		victimEnv := env
		if point != "mid-refund" {
			victimEnv = append(victimEnv, "RATCHET_CRASH_AT="+point)
		}
		victim := startService(t, bin, victimEnv, "serve", "--addr", "127.0.0.1:0")
		if point == "mid-refund" {
			midRefund.Store(victim.cmd.Process)
		}
		var wg sync.WaitGroup
		for i := range perPoint {
			key := fmt.Sprintf("refused-%s-%d", point, i)
			total++
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r := post(client, runsURL(victim.base, "payment"), key, body); r.err == nil && r.status == http.StatusConflict {
					return // compensated before the crash
				}
				// The stored answer of the compensated run is final.
				final := func(r postResult) bool {
					return r.status == http.StatusConflict && r.header.Get("Idempotent-Replayed") == "true"
				}
				retryUntil(client, runsURL(survivor.base, "payment"), key, body, final, func(problem string) {
					mu.Lock()
					problems = append(problems, problem)
					mu.Unlock()
				})
			}()
		}
		wg.Wait()
		select {
		case <-victim.exited:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the victim was never killed", point)
		}
	}
	if len(problems) > 0 {
		rows, err := pool.Query(ctx, `SELECT idempotency_key, status, coalesce(error::text, ''), coalesce(waiting_for::text, ''), attempt,
			(SELECT string_agg(name, ',' ORDER BY seq) FROM ratchet.phases WHERE run_id = runs.id)
			FROM ratchet.runs WHERE workflow = 'payment' AND status <> 'compensated'`)
		require.NoError(t, err)
		for rows.Next() {
			var key, status, runErr, waiting, phases string
			var attempt int
			require.NoError(t, rows.Scan(&key, &status, &runErr, &waiting, &attempt, &phases))
			t.Logf("%s: %s attempt %d error %s waiting %s phases %s", key, status, attempt, runErr, waiting, phases)
		}
		t.Logf("survivor's log:\n%s", survivor.stderr)
	}
	require.Empty(t, problems)

	var compensated, refused, ledgerRows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs WHERE workflow = 'payment' AND status = 'compensated'`).Scan(&compensated))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM payments.payments WHERE status = 'refused'`).Scan(&refused))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM payments.ledger_entries`).Scan(&ledgerRows))
	require.Equal(t, total, compensated, "every payment ends compensated")
	require.Equal(t, total, refused)
	require.Zero(t, ledgerRows, "never posted")
	stats := gateway.Stats()
	require.Equal(t, total, stats.Charges, "one charge per payment")
	require.Equal(t, total, stats.Refunds, "one refund per payment")
	require.Len(t, stats.RefundsByCharge, total, "every charge refunded")
	for charge, n := range stats.RefundsByCharge {
		require.Equal(t, 1, n, "charge %s refunded once", charge)
	}
	for key := range stats.RefundsByKey {
		require.NotContains(t, stats.ChargesByKey, key, "a refund's key is not its charge's")
	}
	t.Logf("%d refused payments over %d crash points: %d charges, %d refunds", total, len(points), stats.Charges, stats.Refunds)
}

type postResult struct {
	status int
	header http.Header
	err    error
}

// crashPayments is how many payments a crash matrix sends per crash point:
// RATCHET_CRASH_PAYMENTS, else def.
func crashPayments(def int) int {
	if n, err := strconv.Atoi(os.Getenv("RATCHET_CRASH_PAYMENTS")); err == nil && n > 0 {
		return n
	}
	return def
}

// kill is a gateway hook that kills the process in victim, once.
func kill(victim *atomic.Pointer[os.Process]) func(string) {
	hook, _ := killNoted(victim)
	return hook
}

// killNoted is kill that also sends the moment of the kill on killed.
func killNoted(victim *atomic.Pointer[os.Process]) (hook func(string), killed <-chan time.Time) {
	at := make(chan time.Time, 1)
	return func(string) {
		if p := victim.Swap(nil); p != nil {
			_ = p.Signal(syscall.SIGKILL)
			at <- time.Now()
		}
	}, at
}

// runsURL is where a service at base starts runs of workflow.
func runsURL(base, workflow string) string { return base + "/v1/workflows/" + workflow + "/runs" }

// retryUntil posts a start with key to url (runsURL) until final says its
// answer is, for at most a minute, reporting every 5xx and a
// start that never got there.
func retryUntil(client *http.Client, url, key, body string, final func(postResult) bool, report func(string)) {
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
		r := post(client, url, key, body)
		if final(r) {
			return
		}
		if r.status >= 500 {
			report(fmt.Sprintf("%s: %d", key, r.status))
		}
		time.Sleep(200 * time.Millisecond) // a client's pause between retries
	}
	report(key + ": never final")
}

// post starts a run at url (runsURL) with key and body.
func post(client *http.Client, url, key, body string) postResult {
	return postWith(client, url, key, body, nil)
}

// postWith is post with the request's headers besides the key's.
func postWith(client *http.Client, url, key, body string, header http.Header) postResult {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return postResult{err: err}
	}
	for name, values := range header {
		req.Header[name] = values
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return postResult{err: err}
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	return postResult{status: resp.StatusCode, header: resp.Header}
}

// TestSIGTERMAnswersWaitingClientsAtOnceAndEndsWithinTheGrace: a client
// that asked to wait a minute for a payment stuck at a slow gateway gets
// 202 with the run's Location as soon as the service is told to stop, and
// the service exits within its worker's grace (5 s) and a second, having
// handed the run over.
func TestSIGTERMAnswersWaitingClientsAtOnceAndEndsWithinTheGrace(t *testing.T) {
	t.Parallel()
	bin := buildCrashBinary(t)
	url := testdb.NewURL(t)
	gateway := fakes.NewGateway(nil)
	gateway.SetFaults(fakes.Faults{Latency: 8 * time.Second}) // longer than the grace
	charging := make(chan struct{}, 1)
	gwSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case charging <- struct{}{}:
		default:
		}
		gateway.ServeHTTP(w, r)
	}))
	defer gwSrv.Close()
	mailSrv := httptest.NewServer(fakes.NewMail(nil))
	defer mailSrv.Close()
	svc := startService(t, bin, []string{"DATABASE_URL=" + smallPool(url), "RATCHET_GATEWAY_URL=" + gwSrv.URL, "RATCHET_MAIL_URL=" + mailSrv.URL},
		"serve", "--addr", "127.0.0.1:0")

	type answer struct {
		status   int
		location string
		at       time.Time
	}
	answered := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, svc.base+"/v1/workflows/payment/runs",
			strings.NewReader(`{"amount": 1299, "currency": "usd", "customer": "cus_123", "email": "a@example.com"}`))
		req.Header.Set("Idempotency-Key", "slow-1")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Prefer", "wait=60")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- answer{}
			return
		}
		resp.Body.Close()
		answered <- answer{status: resp.StatusCode, location: resp.Header.Get("Location"), at: time.Now()}
	}()
	select {
	case <-charging:
	case <-time.After(30 * time.Second):
		t.Fatal("the payment never reached the gateway")
	}
	require.NoError(t, svc.cmd.Process.Signal(syscall.SIGTERM))
	term := time.Now()

	a := <-answered
	require.Equal(t, http.StatusAccepted, a.status)
	require.True(t, strings.HasPrefix(a.location, "/v1/runs/"), a.location)
	require.Less(t, a.at.Sub(term), 10*time.Second, "answered at once, not after the minute it asked to wait")
	select {
	case <-svc.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("the service did not exit")
	}
	took := time.Since(term)
	// The gateway never answers: the service must not wait for it past
	// its 5 s grace and the hand-over (a second or so when quiet).
	require.Less(t, took, 10*time.Second, "within the 5 s grace and the hand-over")
	require.True(t, svc.cmd.ProcessState.Success(), "a graceful stop exits 0: %s", svc.stderr)

	var status string
	var leased bool
	pool := testdb.Connect(t, url, nil)
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT status, lease_expires_at IS NOT NULL FROM ratchet.runs WHERE idempotency_key = 'slow-1'`).Scan(&status, &leased))
	require.Equal(t, "pending", status)
	require.False(t, leased, "handed over, not left to its lease")
	t.Logf("SIGTERM: client answered after %s, service exited after %s", a.at.Sub(term).Round(time.Millisecond), took.Round(time.Millisecond))
}

// smallPool caps a service's pool: several services run at once in the
// suite beside other packages' tests, and the pool they would size from
// their settings (serve's 80) would exhaust the server's connections.
func smallPool(url string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "pool_max_conns=12"
}
