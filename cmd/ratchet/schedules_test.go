package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func (s *opsServer) schedules(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Main(context.Background(), append(append([]string{"schedules"}, args...), "--server", s.url, "--token", "s3cret"), &out, &errOut)
	return out.String(), errOut.String(), code
}

// The schedules commands against a real API: put, list, show, pause,
// resume, trigger (once per key), delete, and a bad one said in a line.
func TestSchedulesCommandsAgainstARealServer(t *testing.T) {
	t.Parallel()
	s := startOpsServer(t)
	out, errOut, code := s.schedules(t, "list")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "no schedules\n", out)

	out, errOut, code = s.schedules(t, "put", "nightly", "--cron", "0 2 * * *", "--time-zone", "Europe/Paris", "--workflow", "order", "--input", `"fine"`, "--catch-up", "all")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `schedule nightly  0 2 * * * (Europe/Paris)  starts order with "fine"`)
	require.Contains(t, out, "catch-up all, overlap skip; declared by api")
	_, errOut, code = s.schedules(t, "put", "hourly", "--every", "1h", "--workflow", "order", "--input", `"fine"`)
	require.Equal(t, 0, code, errOut)

	out, _, code = s.schedules(t, "list")
	require.Equal(t, 0, code)
	require.Regexp(t, `(?m)^hourly\s+every 1h0m0s\s+order\s+next \S+Z\s+0\s+0\s+one\s+skip\s+api$`, out)
	require.Regexp(t, `(?m)^nightly\s+0 2 \* \* \* \(Europe/Paris\)\s+order\s+next `, out)

	out, _, code = s.schedules(t, "pause", "nightly")
	require.Equal(t, 0, code)
	require.Equal(t, "nightly: paused\n", out)
	out, _, code = s.schedules(t, "show", "nightly")
	require.Equal(t, 0, code)
	require.Contains(t, out, "paused; catch-up all")
	out, _, code = s.schedules(t, "resume", "nightly")
	require.Equal(t, 0, code)
	require.Contains(t, out, "nightly: resumed, next ")

	out, errOut, code = s.schedules(t, "trigger", "nightly", "--key", "ops-1")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `^nightly: triggered run \S+ \(succeeded\)\n$`, out)
	again, _, code := s.schedules(t, "trigger", "nightly", "--key", "ops-1")
	require.Equal(t, 0, code)
	require.Equal(t, out, again, "the same run")

	_, errOut, code = s.schedules(t, "put", "bad", "--cron", "61 * * * *", "--workflow", "order")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "invalid_schedule")
	require.Contains(t, errOut, "above maximum")
	require.Equal(t, 1, bytes.Count([]byte(errOut), []byte("\n")), "one line: %q", errOut)

	out, _, code = s.schedules(t, "delete", "hourly")
	require.Equal(t, 0, code)
	require.Equal(t, "hourly: deleted\n", out)
	_, errOut, code = s.schedules(t, "show", "hourly")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "schedule_not_found")
}
