package engine

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// gaugeRefresh is how old the summary behind the gauges may be: every
// collection of every process would otherwise count all unfinished runs.
const gaugeRefresh = 10 * time.Second

// registerRunGauges reports BlockedSummary as gauges on mp's meter: runs
// by blocked reason, the oldest due-but-untaken age and the longest
// same-error streak. Every process that enables them reports the same
// global figures: aggregate them with max, not sum.
func (c *Client) registerRunGauges(mp metric.MeterProvider) error {
	meter := mp.Meter(instrumentation)
	blocked, err := meter.Int64ObservableGauge("ratchet.runs.blocked",
		metric.WithDescription("Unfinished runs by blocked reason (ratchet.blocked_reason)."), metric.WithUnit("{run}"))
	if err != nil {
		return err
	}
	oldest, err := meter.Float64ObservableGauge("ratchet.runs.oldest_due",
		metric.WithDescription("How long the longest-due run that no executor holds has been due: a symptom of no live worker."), metric.WithUnit("s"))
	if err != nil {
		return err
	}
	streak, err := meter.Int64ObservableGauge("ratchet.runs.longest_error_streak",
		metric.WithDescription("The most retryable failures in a row with one error, among runs backing off."), metric.WithUnit("{failure}"))
	if err != nil {
		return err
	}
	var (
		mu   sync.Mutex
		last *RunsSummary
		at   time.Time
	)
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		mu.Lock()
		defer mu.Unlock()
		if last == nil || time.Since(at) >= gaugeRefresh {
			qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			s, err := c.BlockedSummary(qctx)
			cancel()
			if err != nil {
				return err
			}
			last, at = s, time.Now()
		}
		for _, r := range BlockedReasons() {
			o.ObserveInt64(blocked, int64(last.ByReason[r]), metric.WithAttributes(attribute.String("ratchet.blocked_reason", string(r))))
		}
		o.ObserveFloat64(oldest, last.OldestDue.Seconds())
		o.ObserveInt64(streak, int64(last.LongestStreak))
		return nil
	}, blocked, oldest, streak)
	return err
}
