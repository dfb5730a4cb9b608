package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ticks lists a cron expression's first n ticks after from, in UTC.
func ticks(t *testing.T, expr, tz string, from time.Time, n int) []string {
	t.Helper()
	c, err := parseCron(expr, tz)
	require.NoError(t, err)
	var out []string
	for range n {
		from = c.next(from)
		require.False(t, from.IsZero())
		out = append(out, from.UTC().Format("01-02 15:04"))
	}
	return out
}

func TestCronTicksAcrossDaylightSavingTime(t *testing.T) {
	t.Parallel()
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)

	// 2026-11-01: 02:00 EDT becomes 01:00 EST, 01:00–02:00 happens twice.
	fallEve := time.Date(2026, 10, 31, 12, 0, 0, 0, ny)
	require.Equal(t, []string{"11-01 05:30", "11-02 06:30", "11-03 06:30"},
		ticks(t, "30 1 * * *", "America/New_York", fallEve, 3), "a daily 01:30 fires once, at the first pass")
	require.Equal(t, []string{"11-01 05:00", "11-01 05:30", "11-01 06:00", "11-01 06:30", "11-01 07:00"},
		ticks(t, "*/30 * * * *", "America/New_York", time.Date(2026, 11, 1, 0, 45, 0, 0, ny), 5),
		"every half hour keeps elapsed time through both passes")

	// 2026-03-08: 02:00 EST becomes 03:00 EDT, 02:00–03:00 never happens.
	springEve := time.Date(2026, 3, 7, 12, 0, 0, 0, ny)
	require.Equal(t, []string{"03-08 07:30", "03-09 06:30"},
		ticks(t, "30 2 * * *", "America/New_York", springEve, 2), "a skipped 02:30 fires at 03:30 EDT, later by the gap")
	require.Equal(t, []string{"03-08 06:30", "03-08 07:00", "03-08 07:30"},
		ticks(t, "*/30 * * * *", "America/New_York", time.Date(2026, 3, 8, 1, 15, 0, 0, ny), 3),
		"every half hour: 01:30 EST, then 03:00 EDT, thirty minutes later")
	require.Equal(t, []string{"03-08 07:30", "03-09 06:30", "03-09 07:30"},
		ticks(t, "30 2,3 * * *", "America/New_York", springEve, 3), "02:30 shifted onto 03:30 fires once that night")
}

func TestCronTicksInUTCAndZones(t *testing.T) {
	t.Parallel()
	from := time.Date(2026, 12, 5, 10, 7, 0, 0, time.UTC)
	require.Equal(t, []string{"12-05 10:10", "12-05 10:15"}, ticks(t, "*/5 * * * *", "", from, 2))
	require.Equal(t, []string{"12-06 00:00"}, ticks(t, "@daily", "", from, 1))
	require.Equal(t, []string{"12-05 23:00"}, ticks(t, "0 0 * * *", "Europe/Paris", from, 1), "midnight in Paris is 23:00 UTC in winter")
	require.Equal(t, []string{"12-07 09:00"}, ticks(t, "0 9 * * mon-fri", "", from, 1), "a Saturday: the next weekday is Monday")
}

func TestBadCronExpressionsAreRefused(t *testing.T) {
	t.Parallel()
	for _, bad := range []struct{ expr, tz, want string }{
		{"61 * * * *", "", "above maximum"},
		{"* * *", "", "expected exactly 5 fields"},
		{"0 0 30 2 *", "", "never fires"},
		{"@every 1h", "", "use Every"},
		{"CRON_TZ=Europe/Paris 0 0 * * *", "", "TimeZone"},
		{"0 0 * * *", "Mars/Olympus", "IANA"},
		{"0 0 * * *", "Local", "IANA"},
		{"", "", "cron"},
	} {
		_, err := parseCron(bad.expr, bad.tz)
		require.ErrorContains(t, err, bad.want, "%q in %q", bad.expr, bad.tz)
	}
}
