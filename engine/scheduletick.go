package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// dueSchedulesSQL locks the due schedules of the workflows this client
// registers ($1), a few at a time; a schedule another process is ticking
// is skipped, not waited for.
const dueSchedulesSQL = `SELECT ` + scheduleColumns + `, now() FROM ratchet.schedules
WHERE NOT paused AND next_tick_at <= now() AND workflow = ANY($1)
ORDER BY next_tick_at
LIMIT 10
FOR UPDATE SKIP LOCKED`

const tickedSQL = `UPDATE ratchet.schedules SET next_tick_at = $3, last_tick_at = coalesce($4, last_tick_at),
	last_run_id = coalesce($5, last_run_id), started = started + $6, skipped = skipped + $7, updated_at = now()
WHERE tenant = $1 AND name = $2`

// TickSchedules starts the runs of the due ticks of the schedules whose
// workflows this client registers, and returns how many it started and
// the earliest next tick of any schedule (zero if none is unpaused). Each
// schedule is ticked in one transaction that locks its row, starts its
// ticks' runs (StartTx: a worker executes them) and moves its next tick
// past them: a tick is started once, by whichever process gets there
// first, and a process that dies mid-tick leaves nothing half done. A
// worker's recoverer calls it as ticks fall due.
func (c *Client) TickSchedules(ctx context.Context) (started int, next time.Time, err error) {
	names := c.workflows.Names()
	for range 100 { // until no schedule is due; a pass takes a few
		n, more, err := c.tickSome(ctx, names)
		started += n
		if err != nil {
			return started, time.Time{}, err
		}
		if !more {
			break
		}
	}
	var earliest *time.Time
	if err := c.pool.QueryRow(ctx, `SELECT min(next_tick_at) FROM ratchet.schedules WHERE NOT paused AND workflow = ANY($1)`, names).Scan(&earliest); err != nil {
		return started, time.Time{}, fmt.Errorf("engine: next tick: %w", notMigrated(err))
	}
	if started > 0 {
		c.ring() // the runs are due: a worker polls at once
	}
	if earliest == nil {
		return started, time.Time{}, nil
	}
	return started, *earliest, nil
}

// tickSome ticks the schedules one statement finds due, in one
// transaction; more reports whether it found a full page of them, or one
// still due after its pass.
func (c *Client) tickSome(ctx context.Context, names []string) (started int, more bool, err error) {
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, dueSchedulesSQL, names)
		if err != nil {
			return err
		}
		type due struct {
			s   *ScheduleState
			now time.Time
		}
		var page []due
		for rows.Next() {
			var d due
			s, err := scanSchedule(rows, &d.now)
			if err != nil {
				rows.Close()
				return err
			}
			d.s = s
			page = append(page, d)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		more = len(page) == 10
		for _, d := range page {
			n, still, err := c.tick(ctx, tx, d.s, d.now)
			if err != nil {
				return err
			}
			started += n
			more = more || still
		}
		return nil
	})
	if err != nil {
		return 0, false, fmt.Errorf("engine: tick schedules: %w", notMigrated(err))
	}
	return started, more, nil
}

// maxTicksAPass bounds the ticks one pass looks at for one schedule; a
// schedule further behind (a per-second schedule after a day down) is
// caught up over several passes.
const maxTicksAPass = 1000

// tick handles one due schedule, locked in tx, at the database's time
// now: its due ticks, by its CatchUp and Overlap. still reports that it
// is due yet (more ticks than a pass takes).
func (c *Client) tick(ctx context.Context, tx pgx.Tx, s *ScheduleState, now time.Time) (started int, still bool, err error) {
	t, err := s.Schedule.check()
	if err != nil {
		return 0, false, err // stored by PutSchedule, which checked it: a release that reads it otherwise
	}
	var ticks []time.Time
	at := s.NextTickAt
	for !at.After(now) && len(ticks) < maxTicksAPass && !at.IsZero() {
		ticks = append(ticks, at)
		at = t.next(at)
	}
	still = !at.IsZero() && !at.After(now)
	next := at

	var start []time.Time
	switch s.CatchUp {
	case CatchUpAll:
		start = ticks
		if len(start) > maxTicksStarted {
			start, next, still = start[:maxTicksStarted], ticks[maxTicksStarted], true
		}
	case CatchUpOne:
		if !still { // the latest due tick is in this pass
			start = ticks[len(ticks)-1:]
		}
	case CatchUpSkip:
		for _, tick := range ticks {
			if now.Sub(tick) <= CatchUpWindow {
				start = append(start, tick)
			}
		}
	}
	skipped := len(ticks) - len(start)
	if s.CatchUp == CatchUpAll {
		skipped = 0 // what this pass left waits for the next
	}

	running, err := c.lastRunUnfinished(ctx, tx, s)
	if err != nil {
		return 0, false, err
	}
	var lastTick *time.Time
	var lastRun *string
	for _, tick := range start {
		if running && s.Overlap == OverlapSkip {
			skipped++
			continue
		}
		p := StartParams{Workflow: s.Workflow, Input: s.Input, IdempotencyKey: tickKey(s.Name, tick), StartOpts: StartOpts{Tenant: s.Tenant}}
		if s.Overlap == OverlapBuffer {
			p.ConcurrencyKey, p.ConcurrencyLimit = "schedule:"+s.Name, 1
		}
		res, err := c.start(ctx, tx, nil, p, false)
		if err != nil {
			return 0, false, fmt.Errorf("schedule %q, tick %s: %w", s.Name, tick.UTC().Format(time.RFC3339), err)
		}
		if res.Outcome == OutcomeCreated {
			started++
		}
		lastTick, lastRun, running = &tick, &res.Run.ID, !res.Run.Status.Finished()
	}
	if next.IsZero() {
		// The schedule never fires again (a date that has passed):
		// parked far ahead rather than polled for ever.
		next = now.AddDate(100, 0, 0)
	}
	if _, err := tx.Exec(ctx, tickedSQL, s.Tenant, s.Name, next, lastTick, lastRun, started, skipped); err != nil {
		return 0, false, err
	}
	return started, still, nil
}

// lastRunUnfinished reports whether the schedule's last run is yet to
// finish (a run since pruned has finished).
func (c *Client) lastRunUnfinished(ctx context.Context, tx pgx.Tx, s *ScheduleState) (bool, error) {
	if s.LastRunID == nil {
		return false, nil
	}
	var unfinished bool
	err := tx.QueryRow(ctx, `SELECT finished_at IS NULL FROM ratchet.runs WHERE id = $1`, *s.LastRunID).Scan(&unfinished)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return unfinished, err
}

// tickKey is the idempotency key of a tick's run: the schedule and the
// tick, to the second, in UTC.
func tickKey(name string, tick time.Time) string {
	return "schedule/" + name + "/" + tick.UTC().Format(time.RFC3339)
}

// triggerKey is the idempotency key of a trigger's run: the schedule and
// the caller's key, hashed when they would not fit in 255 characters.
func triggerKey(name, key string) string {
	k := "schedule/" + name + "/trigger/" + key
	if len([]rune(k)) <= 255 {
		return k
	}
	sum := sha256.Sum256([]byte(key))
	return "schedule/" + name + "/trigger/sha256:" + hex.EncodeToString(sum[:16])
}
