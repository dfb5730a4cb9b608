package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Schedule starts a workflow's runs on a calendar (Cron, in TimeZone) or at
// a fixed interval (Every), durably (docs/schedules.md): each tick starts
// exactly one run, whose idempotency key names the schedule and the tick
// ("schedule/nightly/2026-12-07T02:00:00Z"), across any number of
// processes. Declare schedules in code (Config.Schedules, put by each
// worker as it starts) or over the API (PutSchedule).
type Schedule struct {
	// Name is the schedule's name within its tenant: 1..200 letters,
	// digits, '.', '-' or '_'.
	Name string
	// Cron is a five-field cron expression (minute hour day month
	// weekday, names and ranges allowed) or @yearly, @monthly, @weekly,
	// @daily or @hourly, on the wall clock of TimeZone.
	Cron string
	// TimeZone is the IANA zone of Cron ("Europe/Paris"); empty is UTC.
	// Daylight saving time is cron's: a schedule naming its hours fires
	// once at a repeated wall time and, at a skipped one, once the gap is
	// over; one of every hour keeps elapsed time.
	TimeZone string
	// Every is a fixed interval instead of Cron: a whole number of
	// seconds, at least one; ticks fall on its multiples since the zero
	// time (every hour on the hour, UTC).
	Every time.Duration
	// Workflow is the workflow each tick starts, with Input (JSON;
	// defaults to {}), in Tenant (defaults to "default").
	Workflow string
	Input    json.RawMessage
	Tenant   string
	// CatchUp says what becomes of ticks missed while no process ticked
	// (everything was down): CatchUpOne (the default) starts the latest.
	CatchUp CatchUp
	// Overlap says what a tick does while the schedule's last run is
	// unfinished: OverlapSkip (the default) starts nothing.
	Overlap Overlap
}

// CatchUp is a schedule's policy for ticks missed by more than
// CatchUpWindow.
type CatchUp string

const (
	// CatchUpSkip skips every missed tick.
	CatchUpSkip CatchUp = "skip"
	// CatchUpOne starts the latest missed tick and skips the others.
	CatchUpOne CatchUp = "one"
	// CatchUpAll starts every missed tick, oldest first, at most
	// maxTicksStarted a pass.
	CatchUpAll CatchUp = "all"
)

// Overlap is a schedule's policy for a tick while its last run is
// unfinished.
type Overlap string

const (
	// OverlapSkip starts nothing for the tick.
	OverlapSkip Overlap = "skip"
	// OverlapBuffer starts the tick's run queued behind the last: the
	// schedule's runs execute one at a time, in tick order (a concurrency
	// key "schedule:<name>" of limit 1).
	OverlapBuffer Overlap = "buffer"
	// OverlapAllow starts the tick's run beside the last.
	OverlapAllow Overlap = "allow"
)

// CatchUpWindow is how late a tick may start and still count as on time:
// a tick later than that was missed, and its schedule's CatchUp decides.
const CatchUpWindow = time.Minute

// maxTicksStarted bounds the runs one pass starts for one schedule
// catching up; the rest start at the next pass.
const maxTicksStarted = 100

// timing is a schedule's parsed Cron or Every.
type timing struct {
	cron  *cronSpec
	every time.Duration
}

func (t timing) next(after time.Time) time.Time {
	if t.cron != nil {
		return t.cron.next(after)
	}
	return after.Truncate(t.every).Add(t.every)
}

// check validates s, filling in its defaults, and parses its timing.
func (s *Schedule) check() (timing, error) {
	if s.Tenant == "" {
		s.Tenant = DefaultTenant
	}
	if len(s.Input) == 0 {
		s.Input = json.RawMessage(`{}`)
	}
	if s.CatchUp == "" {
		s.CatchUp = CatchUpOne
	}
	if s.Overlap == "" {
		s.Overlap = OverlapSkip
	}
	bad := func(format string, args ...any) (timing, error) {
		return timing{}, fmt.Errorf("%w %q: %s", ErrInvalidSchedule, s.Name, fmt.Sprintf(format, args...))
	}
	switch {
	case !validName(s.Name) || len(s.Name) > 200:
		return bad("want a name of 1..200 letters, digits, '.', '-' or '_'")
	case !validName(s.Workflow):
		return bad("workflow %q is not a workflow name", s.Workflow)
	case s.CatchUp != CatchUpSkip && s.CatchUp != CatchUpOne && s.CatchUp != CatchUpAll:
		return bad("catch-up %q: want skip, one or all", s.CatchUp)
	case s.Overlap != OverlapSkip && s.Overlap != OverlapBuffer && s.Overlap != OverlapAllow:
		return bad("overlap %q: want skip, buffer or allow", s.Overlap)
	case (s.Cron == "") == (s.Every == 0):
		return bad("want a cron expression or an interval, one of them")
	case s.Every != 0 && (s.Every < time.Second || s.Every%time.Second != 0):
		return bad("interval %s: want a whole number of seconds, 1s or more", s.Every)
	case s.Every != 0 && s.TimeZone != "":
		return bad("a time zone applies to a cron expression, not to an interval")
	}
	if err := checkKey(s.Tenant); err != nil {
		return bad("tenant: %v", err)
	}
	if s.Every != 0 {
		return timing{every: s.Every}, nil
	}
	c, err := parseCron(s.Cron, s.TimeZone)
	if err != nil {
		return bad("%v", err)
	}
	return timing{cron: c}, nil
}

// ScheduleState is a schedule as stored, with what it has done.
type ScheduleState struct {
	Schedule
	// Source is who declared it last: "code" (Config.Schedules) or "api".
	Source string
	// Paused schedules tick no more until resumed; their ticks meanwhile
	// are missed (CatchUp).
	Paused bool
	// NextTickAt is the next tick not yet started or skipped.
	NextTickAt time.Time
	// LastTickAt and LastRunID are the last tick that started a run, and
	// that run.
	LastTickAt *time.Time
	LastRunID  *string
	// Started counts the runs ticks started; Skipped the ticks that
	// started none (missed, or overlapping).
	Started   int64
	Skipped   int64
	CreatedAt time.Time
	UpdatedAt time.Time
}

const scheduleColumns = `tenant, name, coalesce(cron, ''), coalesce(extract(epoch FROM every), 0)::float8, time_zone, workflow, input,
	catch_up, overlap, source, paused, next_tick_at, last_tick_at, last_run_id, started, skipped, created_at, updated_at`

// scanSchedule reads scheduleColumns, then into more any columns after
// them.
func scanSchedule(row pgx.Row, more ...any) (*ScheduleState, error) {
	var s ScheduleState
	var every float64
	err := row.Scan(append([]any{&s.Tenant, &s.Name, &s.Cron, &every, &s.TimeZone, &s.Workflow, &s.Input, &s.CatchUp, &s.Overlap,
		&s.Source, &s.Paused, &s.NextTickAt, &s.LastTickAt, &s.LastRunID, &s.Started, &s.Skipped, &s.CreatedAt, &s.UpdatedAt}, more...)...)
	s.Every = time.Duration(every * float64(time.Second))
	return &s, err
}

// putScheduleSQL declares a schedule. A new one ticks first at $11; one
// whose timing changed, at $11 too; otherwise its next tick, pause and
// counts stay.
const putScheduleSQL = `
INSERT INTO ratchet.schedules AS s (tenant, name, cron, every, time_zone, workflow, input, catch_up, overlap, source, next_tick_at)
VALUES ($1, $2, nullif($3, ''), CASE WHEN $4::float8 > 0 THEN make_interval(secs => $4::float8) END, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (tenant, name) DO UPDATE SET
	next_tick_at = CASE WHEN (s.cron, s.every, s.time_zone) IS DISTINCT FROM (excluded.cron, excluded.every, excluded.time_zone)
		THEN excluded.next_tick_at ELSE s.next_tick_at END,
	cron = excluded.cron, every = excluded.every, time_zone = excluded.time_zone, workflow = excluded.workflow,
	input = excluded.input, catch_up = excluded.catch_up, overlap = excluded.overlap, source = excluded.source,
	updated_at = now()
RETURNING ` + scheduleColumns

// PutSchedule declares s, or replaces its declaration: its timing, its
// workflow and input, its policies. A new schedule (or one whose timing
// changed) ticks first at its next tick after now; a paused one stays
// paused. The workflow must be registered with this client and the input
// fit it. Bad declarations return ErrInvalidSchedule.
func (c *Client) PutSchedule(ctx context.Context, s Schedule) (*ScheduleState, error) {
	return c.putSchedule(ctx, s, "api")
}

func (c *Client) putSchedule(ctx context.Context, s Schedule, source string) (*ScheduleState, error) {
	t, err := s.check()
	if err != nil {
		return nil, err
	}
	input, err := c.checkScheduleInput(&s)
	if err != nil {
		return nil, err
	}
	now, err := c.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	state, err := scanSchedule(c.pool.QueryRow(ctx, putScheduleSQL, s.Tenant, s.Name, s.Cron, s.Every.Seconds(), s.TimeZone,
		s.Workflow, input, s.CatchUp, s.Overlap, source, t.next(now)))
	if err != nil {
		return nil, fmt.Errorf("engine: put schedule %q: %w", s.Name, notMigrated(err))
	}
	c.ring()
	return state, nil
}

// checkScheduleInput checks the schedule's workflow and input against the
// registry, returning the input canonical.
func (c *Client) checkScheduleInput(s *Schedule) ([]byte, error) {
	def, err := c.workflows.lookup(s.Workflow)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrInvalidSchedule, s.Name, err)
	}
	input, err := canonicalJSON(s.Input)
	if err == nil {
		err = def.checkInput(input)
	}
	if err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrInvalidSchedule, s.Name, err)
	}
	return input, nil
}

func (c *Client) dbNow(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := c.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("engine: read the database's clock: %w", err)
	}
	return now, nil
}

// DeclareSchedules puts every schedule of Config.Schedules (see
// PutSchedule); a worker calls it as it starts.
func (c *Client) DeclareSchedules(ctx context.Context) error {
	for _, s := range c.cfg.Schedules {
		if _, err := c.putSchedule(ctx, s, "code"); err != nil {
			return err
		}
	}
	return nil
}

// GetSchedule returns the tenant's schedule name ("" is the default
// tenant), or ErrScheduleNotFound.
func (c *Client) GetSchedule(ctx context.Context, tenant, name string) (*ScheduleState, error) {
	s, err := scanSchedule(c.pool.QueryRow(ctx, `SELECT `+scheduleColumns+` FROM ratchet.schedules WHERE tenant = $1 AND name = $2`,
		cmpTenant(tenant), name))
	return s, scheduleErr(err, name)
}

// ListSchedules returns the tenant's schedules by name.
func (c *Client) ListSchedules(ctx context.Context, tenant string) ([]*ScheduleState, error) {
	rows, err := c.pool.Query(ctx, `SELECT `+scheduleColumns+` FROM ratchet.schedules WHERE tenant = $1 ORDER BY name`, cmpTenant(tenant))
	if err != nil {
		return nil, fmt.Errorf("engine: list schedules: %w", notMigrated(err))
	}
	defer rows.Close()
	var out []*ScheduleState
	for rows.Next() {
		s, err := scanSchedule(rows)
		if err != nil {
			return nil, fmt.Errorf("engine: list schedules: %w", err)
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// PauseSchedule pauses (paused) or resumes a schedule. A resumed schedule
// treats the ticks it missed while paused by its CatchUp.
func (c *Client) PauseSchedule(ctx context.Context, tenant, name string, paused bool) (*ScheduleState, error) {
	s, err := scanSchedule(c.pool.QueryRow(ctx, `UPDATE ratchet.schedules SET paused = $3, updated_at = now()
		WHERE tenant = $1 AND name = $2 RETURNING `+scheduleColumns, cmpTenant(tenant), name, paused))
	if err == nil && !paused {
		c.ring()
	}
	return s, scheduleErr(err, name)
}

// DeleteSchedule removes a schedule; the runs it started stay.
func (c *Client) DeleteSchedule(ctx context.Context, tenant, name string) error {
	tag, err := c.pool.Exec(ctx, `DELETE FROM ratchet.schedules WHERE tenant = $1 AND name = $2`, cmpTenant(tenant), name)
	if err != nil {
		return fmt.Errorf("engine: delete schedule %q: %w", name, notMigrated(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %q", ErrScheduleNotFound, name)
	}
	return nil
}

// TriggerSchedule starts a run of the schedule now, outside its ticks, as
// Start does (it executes it inline), keyed by the schedule and key: a
// trigger retried with the same key starts nothing more. A paused
// schedule can be triggered.
func (c *Client) TriggerSchedule(ctx context.Context, tenant, name, key string) (*StartResult, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	s, err := c.GetSchedule(ctx, tenant, name)
	if err != nil {
		return nil, err
	}
	return c.Start(ctx, StartParams{Workflow: s.Workflow, Input: s.Input,
		IdempotencyKey: triggerKey(s.Name, key),
		StartOpts:      StartOpts{Tenant: s.Tenant},
	})
}

func cmpTenant(t string) string {
	if t == "" {
		return DefaultTenant
	}
	return t
}

func scheduleErr(err error, name string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: %q", ErrScheduleNotFound, name)
	}
	return fmt.Errorf("engine: schedule %q: %w", name, notMigrated(err))
}
