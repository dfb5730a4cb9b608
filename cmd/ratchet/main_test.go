package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/internal/pgboot"
	"github.com/ratchet-run/ratchet/internal/testdb"
)

func runMain(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Main(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// runUntil runs the command until a printed line contains marker, then
// cancels it and returns everything printed and its exit code.
func runUntil(t *testing.T, marker string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lines := make(lineWriter, 1000)
	done := make(chan int, 1)
	go func() { done <- Main(ctx, args, lines, io.Discard) }()
	var out strings.Builder
	timeout := time.After(60 * time.Second)
	for !strings.Contains(out.String(), marker) {
		select {
		case l := <-lines:
			out.WriteString(l)
		case code := <-done:
			t.Fatalf("exited %d before %q:\n%s", code, marker, out.String())
		case <-timeout:
			t.Fatalf("no %q within a minute:\n%s", marker, out.String())
		}
	}
	cancel()
	code := <-done
	for {
		select {
		case l := <-lines:
			out.WriteString(l)
		default:
			return out.String(), code
		}
	}
}

func TestDevServesThePaymentDemo(t *testing.T) {
	t.Parallel()
	out, code := runUntil(t, "ready; Ctrl-C stops", "dev", "--database-url", testdb.NewURL(t), "--addr", "127.0.0.1:0")
	require.Equal(t, 0, code, out)
	for _, want := range []string{
		"Ratchet is running", "curl -i -X POST http://127.0.0.1:", "/ui/  (and: ratchet runs list --server http://127.0.0.1:",
		"1. payment with Idempotency-Key", "-> 201", `"status":"succeeded"`,
		"2. the same request again -> 201, Idempotent-Replayed: true, body identical: true",
		"3. the same key, another amount -> 422",
		"4. a declined card -> 402",
		`5. charged, then refused by the ledger (the account is closed) -> 409`, `"code":"account_closed"`, `"compensated":["charge_created"]`,
		"gateway: 2 charge(s), 1 refund(s); mail: 1 receipt(s) delivered",
		"6. a payout -> 202 waiting for bank_settled",
		`then -> succeeded {"status":"settled","transfer_id":"tr_1"}; webhooks received: 2`,
		"shutting down",
	} {
		require.Contains(t, out, want)
	}
}

func TestServeRefusesAnUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	pool := testdb.Connect(t, url, nil)
	_, err := pool.Exec(context.Background(), `DROP SCHEMA ratchet CASCADE`)
	require.NoError(t, err)
	code, _, errOut := runMain(t, "serve", "--database-url", url, "--addr", "127.0.0.1:0")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "run `ratchet migrate` first")
}

func TestServeRunsTheAPIUntilStopped(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	out, code := runUntil(t, "ratchet API listening on", "serve", "--database-url", url, "--addr", "127.0.0.1:0", "--tokens", "s3cret=acme")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "shutting down")
	var accounts int
	require.NoError(t, testdb.Connect(t, url, nil).QueryRow(context.Background(), `SELECT count(*) FROM quickstart.accounts`).Scan(&accounts))
	require.Zero(t, accounts, "serve seeds no demo data into the database it is pointed at")
}

func TestBadTokensAreRefusedWithoutEchoingThem(t *testing.T) {
	t.Parallel()
	code, _, errOut := runMain(t, "serve", "--database-url", testdb.NewURL(t), "--addr", "127.0.0.1:0", "--tokens", "supersecretvalue")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "want token=tenant")
	require.NotContains(t, errOut, "supersecretvalue")
}

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t) // cloned from a migrated template
	code, out, errOut := runMain(t, "migrate", "--database-url", url)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "database is up to date\n", out)
}

// A rolling upgrade migrates twice: before, keeping what the previous
// release uses, and after, dropping it.
func TestMigrateKeepCompatibleLeavesContractMigrations(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	_, err := testdb.Connect(t, url, nil).Exec(context.Background(), `DROP SCHEMA ratchet CASCADE`)
	require.NoError(t, err)
	code, out, errOut := runMain(t, "migrate", "--database-url", url, "--keep-compatible")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "applied 0013_request_index.sql\n")
	require.NotContains(t, out, "applied 0014")
	require.Contains(t, out, "left 0014_drop_request_key_index.sql for later")
	code, out, errOut = runMain(t, "migrate", "--database-url", url)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "applied 0014_drop_request_key_index.sql\n", out)
}

func TestConnectionErrorsAreOneActionableLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url, want string
	}{
		{"postgres://postgres@127.0.0.1:1/db?connect_timeout=2", "cannot reach Postgres at 127.0.0.1:1/db: connect: connection refused (start it, or set DATABASE_URL)"},
		{"nonsense:://", "bad database URL:"},
	} {
		code, out, errOut := runMain(t, "migrate", "--database-url", tc.url)
		require.Equal(t, 1, code)
		require.Empty(t, out)
		require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
		require.Contains(t, errOut, tc.want)
	}
}

func TestUnknownCommandIsAUsageError(t *testing.T) {
	t.Parallel()
	code, _, errOut := runMain(t, "bogus")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "unexpected argument bogus")
}

// lineWriter hands each written line to a channel.
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) {
	w <- string(p)
	return len(p), nil
}

func TestFakesServesTheGatewayUntilCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	lines := make(lineWriter, 4)
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"fakes", "--gateway-addr", "127.0.0.1:0", "--mail-addr", "127.0.0.1:0", "--bank-addr", "127.0.0.1:0"}, lines, io.Discard)
	}()

	banner := <-lines
	m := regexp.MustCompile(`listening on (http://\S+)`).FindStringSubmatch(banner)
	require.NotNil(t, m, banner)
	resp, err := http.Get(m[1] + "/stats")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	cancel()
	require.Equal(t, 0, <-done)
}

func TestFakesReportsAPortInUse(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	code, _, errOut := runMain(t, "fakes", "--gateway-addr", ln.Addr().String())
	require.Equal(t, 1, code)
	require.Equal(t, "ratchet: fake gateway cannot listen on "+ln.Addr().String()+": bind: address already in use\n", errOut)
}

func TestDevStartsAThrowawayPostgresWhenNoneAnswers(t *testing.T) {
	t.Parallel()
	if _, err := pgboot.FindBin(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lines := make(lineWriter, 1000)
	done := make(chan error, 1)
	cmd := &devCmd{Addr: "127.0.0.1:0", StaleAfter: 5 * time.Second, Demo: true, probeURL: "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1"}
	go func() { done <- cmd.Run(&env{ctx: ctx, stdout: lines, stderr: io.Discard}) }()
	var out strings.Builder
	for !strings.Contains(out.String(), "ready; Ctrl-C stops") {
		select {
		case l := <-lines:
			out.WriteString(l)
		case err := <-done:
			t.Fatalf("dev ended (%v):\n%s", err, out.String())
		case <-time.After(90 * time.Second):
			t.Fatalf("dev never became ready:\n%s", out.String())
		}
	}
	require.Contains(t, out.String(), "no Postgres answers at 127.0.0.1:1/postgres; starting a throwaway cluster")
	require.Contains(t, out.String(), "1. payment with Idempotency-Key")
	require.Contains(t, out.String(), "-> 201")
	cancel()
	require.NoError(t, <-done)
}

func TestDevPrintsSpansWithTraceStdout(t *testing.T) {
	t.Parallel()
	out, code := runUntil(t, "ready; Ctrl-C stops", "dev", "--database-url", testdb.NewURL(t), "--addr", "127.0.0.1:0", "--trace-stdout")
	require.Equal(t, 0, code)
	for _, span := range []string{"ratchet.run payment", "ratchet.phase payment_created", "ratchet.phase charge_created", "ratchet.phase ledger_posted", "POST /v1/workflows/{workflow}/runs"} {
		require.Contains(t, out, `"Name":"`+span+`"`)
	}
}

func TestBenchComparesBothEnginesInAScratchDatabaseItDrops(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t) // the server's databases are listed through it
	code, out, errOut := runMain(t, "bench", "--database-url", url, "--runs", "30", "--rounds", "2", "--phases", "1,2", "--sustained", "0", "--warm-up", "0")
	require.Equal(t, 0, code, errOut)
	for _, row := range []string{`(?m)^\s+1\s+plain\s+\d+`, `(?m)^\s+1\s+worker\s+\d+.*\d\.\d{3} \(\d\.\d{2}–\d\.\d{2}\)\s*$`, `(?m)^\s+2\s+worker\s+`} {
		require.Regexp(t, row, out)
	}
	// A 1-phase run is 5 round trips and 3 commits alone (start; BEGIN,
	// the phase, COMMIT; finish); the start and the finish coalesce with
	// concurrent runs' (the more, the busier the machine), the phase's two
	// other round trips never do.
	costs := regexp.MustCompile(`(?m)^\s+1\s+plain\s+\d+\s+\S+\s+\S+\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s`).FindStringSubmatch(out)
	require.NotNil(t, costs, out)
	trips, commits := mustFloat(t, costs[1]), mustFloat(t, costs[2])
	require.True(t, trips > 3 && trips <= 5 && commits > 1 && commits <= 3 && math.Abs(trips-commits-2) < 0.015,
		"a 1-phase run: %v round trips, %v commits", trips, commits)
	scratch := regexp.MustCompile(`ratchet_bench_[0-9a-z]+`).FindString(errOut)
	require.NotEmpty(t, scratch, errOut)

	pool := testdb.Connect(t, url, nil)
	var left int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_database WHERE datname = $1`, scratch).Scan(&left))
	require.Zero(t, left, "the scratch database is dropped")

	code, _, errOut = runMain(t, "bench", "--database-url", url, "--phases", "0")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "--phases 0")
}

// bench commits measures the engine with coalescing off and on, and step
// results alone or with the next commit, against the bare transaction, at
// each concurrency, in a scratch database: alone, a run of three steps is
// five commits with each step's result by itself, four with the last one
// in the finish.
func TestBenchCommitsComparesCoalescingWithTheBareTransaction(t *testing.T) {
	t.Parallel()
	code, out, errOut := runMain(t, "bench", "commits", "--database-url", testdb.NewURL(t), "--runs", "40", "--rounds", "1", "--concurrency", "1,4")
	require.Equal(t, 0, code, errOut)
	for _, c := range []string{"1", "4"} {
		for _, row := range []string{`bare-tx\s+-\s+\d+`, `bare-stmt\s+-\s+\d+`,
			`alone/steps-apart\s+\d+\s+\d+.*\s5\.\d\d\s+5\.\d\d\s+-\s`, `alone\s+\d+\s+\d+.*\s4\.\d\d\s+4\.\d\d\s+-\s`,
			`coalesced/steps-apart\s+\d+\s+\d+`, `coalesced\s+\d+\s+\d+`} {
			require.Regexp(t, `(?m)^\s+`+c+`\s+`+row, out)
		}
	}
	code, _, errOut = runMain(t, "bench", "commits", "--database-url", testdb.NewURL(t), "--window", "0")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "--window")
}

// bench concurrency keeps the limit it declares: the workflow itself never
// sees two runs of a key at once, and every run succeeds.
func TestBenchConcurrencyKeepsTheLimitAndMeasuresTheHotPath(t *testing.T) {
	t.Parallel()
	code, out, errOut := runMain(t, "bench", "concurrency", "--database-url", testdb.NewURL(t),
		"--runs", "200", "--keys", "5", "--callers", "8", "--work", "5ms", "--queue-runs", "60", "--queue-rate", "20", "--hot-runs", "40", "--hot-rounds", "1")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^\s+200\s+\S+\s+\S+\s+\d+\s+0\s+1\s+[01] \(\d+ samples\)\s+\d+\.\d\d\s+\d+\.\d\d\s*$`, out,
		"all succeeded, at most one of a key at once")
	require.Regexp(t, `(?m)^\s+60\s+\S+\s+\d+\s+\d+\s+([1-9]|1\d|20)\s+20\s+0\s*$`, out, "the queue's runs all succeed, never more than 20 starting in a second")
	require.Regexp(t, `(?m)^\s+triggers on\s+\d+\s+\S+\s+\S+\s+\d+\.\d\d\s+\d+\.\d\d\s+\d\.\d{3} \(`, out)
	require.Regexp(t, `(?m)^\s+triggers off\s+\d+\s+`, out)
	code, _, errOut = runMain(t, "bench", "concurrency", "--database-url", testdb.NewURL(t), "--limit", "0")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "--limit")
}

// bench retention seeds expired runs and measures the hot path under each
// pruning mode; flat out, the pruner deletes every expired run.
func TestBenchRetentionPrunesWhileTheHotPathRuns(t *testing.T) {
	t.Parallel()
	code, out, errOut := runMain(t, "bench", "retention", "--database-url", testdb.NewURL(t),
		"--history", "3000", "--expired", "2000", "--segment", "1s", "--rounds", "1", "--concurrency", "4")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^\s+none\s+\d+\s+\S+\s+\S+\s+1\.000\s+0\s+-`, out)
	require.Regexp(t, `(?m)^\s+paced\s+\d+\s+\S+\s+\S+\s+\d\.\d{3}\s+500\s+\d+`, out, "one batch at the segment's start")
	require.Regexp(t, `(?m)^\s+flat-out\s+\d+\s+\S+\s+\S+\s+\d\.\d{3}\s+1500\s+\d+`, out, "the rest")
	require.Contains(t, out, "expired runs left unpruned: 0")
}

// bench scale starts serve processes (the built command: the test binary
// cannot serve) and posts payments to them.
func TestBenchScaleStartsServeProcessesAndMeasuresThem(t *testing.T) {
	t.Parallel()
	bin := buildCrashBinary(t)
	out, err := exec.Command(bin, "bench", "scale", "--database-url", testdb.NewURL(t),
		"--processes", "1,2", "--duration", "2s", "--warm-up", "0s", "--concurrency", "8").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, n := range []string{"1", "2"} {
		// Well-formed figures, not a quiet machine's: the share of
		// Postgres's CPU may be unattributable ("-"), never negative.
		require.Regexp(t, `(?m)^\s+`+n+`\s+\d+\s+[1-9]\d*\s+\d+\.\d\s+\d+\.\d\s+\d+\.\d%\s+\d+\.\d\d\s+\d+\s+\d+\s+[1-9]\d*\s+(\d+%|-)\s+\d+%\s+\d+%\s*$`, string(out))
	}
	require.Regexp(t, `gateway: [1-9]\d* charges`, string(out))
}

// bench history measures each child-key format at each history size, with
// the tables' and indexes' bytes per run, and drops its scratch database.
func TestBenchHistoryMeasuresEachSizeAndKeyFormat(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	code, out, errOut := runMain(t, "bench", "history", "--database-url", url, "--sizes", "0,2000", "--runs", "40", "--concurrency", "4",
		"--key-formats", "1,2,3", "--wal-compression", "off,pglz")
	require.Equal(t, 0, code, errOut)
	var rows []string
	for _, size := range []string{"0", "2000"} {
		for _, format := range []string{"1", "2", "3"} {
			for _, compression := range []string{"off", "pglz"} {
				rows = append(rows, `(?m)^\s+`+size+`\s+`+format+`\s+`+compression+`\s+40\s+\d+\s+\S+\s+\S+\s+\d+\s+\d+\.\d\d\s+\d+\.\d\d×\s+\d+\s*$`)
			}
		}
	}
	for _, row := range append(rows, `(?m)^\s+runs_request_unique\s+\d+\s*$`,
		`(?m)^\s+phases_child_key_idx\s+\d+\s*$`, `(?m)^\s+runs\s+\d+\s*$`) {
		require.Regexp(t, row, out)
	}
	require.Contains(t, errOut, "seeded 2000 of 2000 runs")
	scratch := regexp.MustCompile(`ratchet_bench_[0-9a-z]+`).FindString(errOut)
	pool := testdb.Connect(t, url, nil)
	var left int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_database WHERE datname = $1`, scratch).Scan(&left))
	require.Zero(t, left, "the scratch database is dropped")

	code, _, errOut = runMain(t, "bench", "history", "--database-url", url, "--sizes", "1000,0")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "ascending")
}

// serve sizes its pool from its settings: the API's inline executions,
// the worker's resumed ones and River's; a URL's pool_max_conns wins, with
// a warning when it is too small.
func TestServeSizesItsPoolFromItsSettings(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	var stderr bytes.Buffer
	e := &env{ctx: context.Background(), stdout: io.Discard, stderr: &stderr}
	f := appFlags{StaleAfter: 30 * time.Second, MaxInline: 32, GatewayURL: "http://127.0.0.1:1", MailURL: "http://127.0.0.1:1", BankURL: "http://127.0.0.1:1"}
	a, closeApp, err := openApp(e, dbFlags{DatabaseURL: url}, f, true)
	require.NoError(t, err)
	defer closeApp()
	// 32 inline + 20 resumed, a quarter again for heartbeats (13), the
	// poll, River's three, Ratchet's queue and the receipts' 10 workers.
	require.EqualValues(t, 32+20+13+1+3+1+10, a.pool.Config().MaxConns)
	require.Equal(t, int(a.pool.Config().MaxConns), workerConfig(f, true).Connections())
	require.NotContains(t, stderr.String(), "smaller")

	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	small, closeSmall, err := openApp(e, dbFlags{DatabaseURL: url + sep + "pool_max_conns=7"}, f, false)
	require.NoError(t, err)
	defer closeSmall()
	require.EqualValues(t, 7, small.pool.Config().MaxConns, "the URL's setting wins")
	require.Contains(t, stderr.String(), "the database pool is smaller than these settings need")
}

func mustFloat(t *testing.T, s string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(s, 64)
	require.NoError(t, err)
	return f
}

// The failover chaos command with synchronous replication: the primary is
// killed mid-load with its WAL sender paused, the standby promoted, and
// nothing acknowledged is lost, every payment succeeds, none is charged or
// receipted twice under two message ids, no request is answered 500 and
// no run fails — promoted by the command, and by Patroni when it is
// installed, after a kill and in a switchover (the old primary back as a
// read-only standby at the URL's first address).
func TestChaosFailoverWithSynchronousReplicationLosesNothing(t *testing.T) {
	t.Parallel()
	bin := buildCrashBinary(t)
	// One after another: each starts servers, a serve process and 800
	// payments, and three at once would starve the package's crash tests
	// (leases of 2 s) of the machine's two cores.
	for _, tc := range []struct{ manager, fail string }{{"manual", "kill"}, {"patroni", "kill"}, {"patroni", "switchover"}} {
		t.Run(tc.manager+"/"+tc.fail, func(t *testing.T) {
			if err := pgboot.PatroniInstalled(); tc.manager == "patroni" && err != nil {
				fmt.Fprintf(os.Stderr, "SKIPPED %s: %v\n", t.Name(), err) // loudly: a skip is otherwise silent without -v
				t.Skip(err)
			}
			cmd := exec.Command(bin, "chaos", "failover", "--manager", tc.manager, "--fail", tc.fail, "--replication", "sync", "--key-formats", "3",
				"--payments", "800", "--fail-after", "1s", "--stall", "500ms", "--timeout", "2m", "--json")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			require.NoError(t, err, "%s", stderr.String())
			var r failoverResult
			require.NoError(t, json.Unmarshal(out, &r), "one JSON object: %s", out)
			require.Equal(t, failoverResult{Replication: "sync", KeyFormat: 3, Payments: 800, Succeeded: 800},
				failoverResult{Replication: r.Replication, KeyFormat: r.KeyFormat, Payments: r.Payments, Succeeded: r.Succeeded},
				"every payment succeeded: %s\n%s", out, stderr.String())
			require.Positive(t, r.AnsweredBefore, "some payments were answered before the failover: %s", out)
			require.Equal(t, [4]int{}, [4]int{r.Lost, r.DuplicateCharges, r.DuplicateReceipts, r.MissingReceipts},
				"no acknowledged run lost, no duplicate charge, no duplicate or missing receipt: %s", out)
			require.Equal(t, [2]int{}, [2]int{r.Answers5xx, r.RunsFailed}, "no request answered 500, no run failed: %s", out)
		})
	}
}

// A connection whose server refuses a write as read-only, as a standby
// does, is closed: the pool's next statement goes out on a fresh
// connection rather than to the same server again.
func TestAReadOnlyConnectionIsReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, err := url.Parse(testdb.NewURL(t))
	require.NoError(t, err)
	q := u.Query()
	q.Set("default_transaction_read_only", "on") // every session read-only, as on a standby
	q.Set("pool_max_conns", "1")                 // so that a kept connection would be the one reused
	u.RawQuery = q.Encode()
	var logged bytes.Buffer
	pool, err := (&dbFlags{DatabaseURL: u.String(), log: newLogger(&logged, slog.LevelInfo)}).connect(ctx)
	require.NoError(t, err)
	defer pool.Close()
	backend := func() (pid int) {
		require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
		return pid
	}

	first := backend()
	require.Equal(t, first, backend(), "one connection, reused while it answers")
	_, err = pool.Exec(ctx, "CREATE TABLE written_on_a_standby (x int)")
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, pgerrcode.ReadOnlySQLTransaction, pgErr.Code)
	require.NotEqual(t, first, backend(), "the read-only connection was dropped")
	require.Contains(t, logged.String(), readOnlyDropped, "and the drop logged")
}
