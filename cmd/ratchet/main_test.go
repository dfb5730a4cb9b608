package main

import (
	"bytes"
	"context"
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
		"by dev-executor-1 (token 2): succeeded",
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
