package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/testdb"
)

// The service runs through PgBouncer in transaction mode — each
// transaction, and each statement or pipeline outside one, may land on
// another server connection — with the settings docs/performance.md gives:
// statement descriptions cached but no named prepared statements
// (default_query_exec_mode=cache_describe; pgx's default mode fails here
// with "prepared statement ... does not exist") and River polling
// (--poll-only). Forty concurrent payments succeed, those past --max-inline
// by the worker's recoverer, each charged once, and every receipt is
// delivered by River's polling worker.
func TestServeThroughPgBouncerInTransactionMode(t *testing.T) {
	t.Parallel()
	dbURL := testdb.NewURL(t)
	bouncer := startPgBouncer(t, dbURL)
	bin := buildCrashBinary(t)
	gateway, mail := fakes.NewGateway(nil), fakes.NewMail(nil)
	gwSrv, mailSrv := httptest.NewServer(gateway), httptest.NewServer(mail)
	defer gwSrv.Close()
	defer mailSrv.Close()
	env := []string{"DATABASE_URL=" + bouncer + "&default_query_exec_mode=cache_describe&pool_max_conns=20",
		"RATCHET_GATEWAY_URL=" + gwSrv.URL, "RATCHET_MAIL_URL=" + mailSrv.URL}
	svc := startService(t, bin, env, "serve", "--addr", "127.0.0.1:0", "--poll-only")

	const payments = 40
	var wg sync.WaitGroup
	statuses := make([]string, payments)
	for i := range payments {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequest(http.MethodPost, svc.base+"/v1/workflows/payment/runs",
				strings.NewReader(fmt.Sprintf(`{"amount": %d, "currency": "usd", "customer": "cus_%d", "email": "p%d@example.com"}`, 100+i, i, i)))
			if err != nil {
				return
			}
			req.Header.Set("Idempotency-Key", fmt.Sprint("bounced-", i))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Errorf("payment %d: %v", i, err)
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			statuses[i] = fmt.Sprintf("%d %s", resp.StatusCode, body)
		}()
	}
	wg.Wait()
	for i, code := range statuses {
		// Past --max-inline (32) a payment is answered 202 and left to the
		// worker, whose recoverer finds it through the pooler too.
		require.True(t, strings.HasPrefix(code, "201 ") || strings.HasPrefix(code, "202 "), "payment %d: %s (service log: %s)", i, code, svc.stderr)
	}
	pool := testdb.Connect(t, dbURL, nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var succeeded int
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM ratchet.runs WHERE status = 'succeeded'`).Scan(&succeeded))
		if succeeded == payments {
			break
		}
		require.True(t, time.Now().Before(deadline), "%d of %d payments succeeded (service log: %s)", succeeded, payments, svc.stderr)
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, payments, gateway.Stats().Charges, "each payment charged once")
	// Receipts are River jobs, found by polling through the pooler.
	deadline = time.Now().Add(30 * time.Second)
	for mail.Stats().Deliveries < payments && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, payments, mail.Stats().Deliveries, "every receipt delivered once")
	// The service's log, read once it has exited.
	require.NoError(t, svc.cmd.Process.Signal(syscall.SIGTERM))
	<-svc.exited
	require.NotContains(t, svc.stderr.String(), "prepared statement")
}

// startPgBouncer runs PgBouncer in transaction mode in front of the server
// of dbURL and returns dbURL through it. Without PgBouncer the test skips
// (CI installs it).
func startPgBouncer(t *testing.T, dbURL string) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, statErr := os.Stat("/usr/sbin/pgbouncer"); statErr != nil {
			t.Skip("SKIPPED: pgbouncer is not installed (apt-get install pgbouncer)")
		}
		bin = "/usr/sbin/pgbouncer"
	}
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())

	// PgBouncer refuses to run as root: it then runs as postgres, and its
	// files must be readable by that user.
	dir, err := os.MkdirTemp("", "ratchet-pgbouncer")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	userName := u.User.Username()
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = 10
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
`, u.Hostname(), u.Port(), port, filepath.Join(dir, "users.txt"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "users.txt"), []byte(strconv.Quote(userName)+` ""`+"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644))
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		pg, err := user.Lookup("postgres")
		require.NoError(t, err, "running as root, PgBouncer needs a user to switch to")
		args = append([]string{"-u", pg.Username}, args...)
	}
	cmd := exec.Command(bin, args...)
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	through := *u
	through.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	q := through.Query()
	q.Set("sslmode", "disable")
	through.RawQuery = q.Encode()
	// Ready when it answers a query (it starts in milliseconds).
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := pgx.Connect(context.Background(), through.String()+"&default_query_exec_mode=simple_protocol")
		if err == nil {
			err = conn.QueryRow(context.Background(), "SELECT 1").Scan(new(int))
			conn.Close(context.Background())
		}
		if err == nil {
			break
		}
		select {
		case <-exited:
			t.Fatalf("pgbouncer exited: %s", out.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "pgbouncer did not answer: %v; %s", err, out.String())
		time.Sleep(20 * time.Millisecond)
	}
	return through.String()
}

// lockedBuffer collects a process's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
