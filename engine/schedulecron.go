package engine

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// cronParser reads five-field cron expressions (minute hour day-of-month
// month day-of-week, with names and ranges) and the descriptors @yearly,
// @monthly, @weekly, @daily and @hourly.
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// cronSpec is a cron expression in its time zone.
//
// The expression is evaluated on the zone's wall clock, and a wall time is
// then placed on the timeline, where daylight saving time makes it exist
// once, twice or not at all. As cron has always done: a schedule that names
// its hours (a daily 01:30, every two hours) fires once at a repeated wall
// time, at its first pass, and once at a skipped one, as soon as the gap is
// over (02:30 on a night that jumps from 02:00 to 03:00 fires at 03:30); a
// schedule of every hour keeps elapsed time, firing at both passes of a
// repeated hour and at none of a skipped one.
type cronSpec struct {
	wall     *cron.SpecSchedule // evaluated in UTC: wall-clock arithmetic
	loc      *time.Location
	allHours bool
}

// parseCron parses expr in the IANA zone tz ("" is UTC).
func parseCron(expr, tz string) (*cronSpec, error) {
	trimmed := strings.TrimSpace(expr)
	if strings.HasPrefix(trimmed, "TZ=") || strings.HasPrefix(trimmed, "CRON_TZ=") {
		return nil, fmt.Errorf("cron %q: name the time zone in TimeZone, not in the expression", expr)
	}
	if strings.HasPrefix(trimmed, "@every") {
		return nil, fmt.Errorf("cron %q: use Every for a fixed interval", expr)
	}
	loc, err := loadZone(tz)
	if err != nil {
		return nil, err
	}
	parsed, err := cronParser.Parse(trimmed)
	if err != nil {
		return nil, fmt.Errorf("cron %q: %v", expr, err)
	}
	spec, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("cron %q: not a calendar expression", expr)
	}
	spec.Location = time.UTC
	const hours = 1<<24 - 1
	c := &cronSpec{wall: spec, loc: loc, allHours: spec.Hour&hours == hours}
	if c.next(time.Now()).IsZero() {
		return nil, fmt.Errorf("cron %q: never fires", expr)
	}
	return c, nil
}

func loadZone(tz string) (*time.Location, error) {
	if tz == "" {
		return time.UTC, nil
	}
	loc, err := time.LoadLocation(tz)
	if err != nil || tz == "Local" {
		return nil, fmt.Errorf("time zone %q: want an IANA name such as Europe/Paris", tz)
	}
	return loc, nil
}

// next returns the schedule's first tick after after; zero if it has none
// within a few years.
//
// Wall times are tried in order from a little before after's — the second
// pass of a repeated hour comes after later wall times' first — and the
// earliest moment after after wins; once a wall time's first moment is
// past it, no later wall time can beat it.
func (c *cronSpec) next(after time.Time) time.Time {
	wall := wallOf(after.Add(-3*time.Hour), c.loc)
	var best time.Time
	for range 5000 {
		if wall = c.wall.Next(wall); wall.IsZero() {
			return best
		}
		moments := c.instants(wall)
		for _, t := range moments {
			if t.After(after) && (best.IsZero() || t.Before(best)) {
				best = t
			}
		}
		if !best.IsZero() && len(moments) > 0 && moments[0].After(best) {
			return best
		}
	}
	return best
}

// instants are the moments the schedule fires at for a wall time it names,
// in order (see cronSpec).
func (c *cronSpec) instants(wall time.Time) []time.Time {
	// The offsets in force a day and a half either side: a zone changes
	// its offset at most once in that time.
	_, before := wall.Add(-36 * time.Hour).In(c.loc).Zone()
	_, after := wall.Add(36 * time.Hour).In(c.loc).Zone()
	var out []time.Time
	for _, off := range []int{before, after} {
		t := wall.Add(-time.Duration(off) * time.Second)
		if wallOf(t, c.loc).Equal(wall) && (len(out) == 0 || !out[0].Equal(t)) {
			out = append(out, t)
		}
	}
	if len(out) == 2 && out[1].Before(out[0]) {
		out[0], out[1] = out[1], out[0]
	}
	switch {
	case c.allHours:
		return out // elapsed time: both passes, or none of a gap
	case len(out) == 0:
		// Skipped: once the gap is over, later by its length.
		return []time.Time{wall.Add(-time.Duration(before) * time.Second)}
	}
	return out[:1]
}

// wallOf is t's wall clock in loc, as a UTC time.
func wallOf(t time.Time, loc *time.Location) time.Time {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC)
}
