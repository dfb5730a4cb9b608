package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/internal/testdb"
)

func runMain(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Main(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestDevRunsTheQuickstartDemo(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	code, out, errOut := runMain(t, "dev", "--database-url", url, "--stale-after", "300ms")
	require.Equal(t, 0, code, "stderr: %s\nstdout: %s", errOut, out)
	for _, want := range []string{
		"created run", "succeeded",
		"finished: stored output replayed",
		"rejected: engine: idempotency key belongs to run",
		`left running at recovery point "debited"`,
		"the worker took it over", "(token 2): succeeded",
		"phase 0 debited", "phase 1 credited",
	} {
		require.Contains(t, out, want)
	}
}

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t) // cloned from a migrated template
	code, out, errOut := runMain(t, "migrate", "--database-url", url)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "database is up to date\n", out)
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
	go func() { done <- Main(ctx, []string{"fakes", "--gateway-addr", "127.0.0.1:0"}, lines, io.Discard) }()

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
