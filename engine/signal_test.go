package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/steps"
)

type transfer struct {
	ID      string        `json:"id"`
	Timeout time.Duration `json:"timeout"`
}

type bankEvent struct {
	Status string `json:"status"`
}

// registerPayout registers "payout": a phase, then an Await of
// "bank_webhook" matched by the transfer id, with the input's timeout; a
// timeout fails the run with its own code.
func registerPayout(t *testing.T, workflows *engine.Workflows) {
	t.Helper()
	_, err := engine.Register(workflows, "payout", func(ctx context.Context, in transfer) (string, error) {
		if _, err := engine.Atomic(ctx, "requested", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "requested") }, nil); err != nil {
			return "", err
		}
		ev, err := engine.Await[bankEvent](ctx, "bank_webhook", &engine.AwaitOpts{CorrelationKey: in.ID, Timeout: in.Timeout})
		var timeout *engine.AwaitTimeoutError
		if errors.As(err, &timeout) {
			return "", steps.Permanent("payout_timed_out", err)
		}
		if err != nil {
			return "", err
		}
		return ev.Status, nil
	}, nil)
	require.NoError(t, err)
}

func payoutInput(id string, timeout time.Duration) []byte {
	return []byte(fmt.Sprintf(`{"id":%q,"timeout":%d}`, id, timeout))
}

func TestASignalWakesTheRunAwaitingItAndARedeliveryIsANoOp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	registerPayout(t, workflows)
	c := b.client(t, workflows, nil)

	res, err := c.Start(ctx, engine.StartParams{Workflow: "payout", IdempotencyKey: "po-1", Input: payoutInput("tr_1", 0)})
	require.NoError(t, err)
	run := res.Run
	require.Equal(t, engine.StatusWaiting, run.Status)
	require.Equal(t, engine.Wait{Kind: engine.KindSignal, Phase: "bank_webhook", Seq: 1, Signal: "bank_webhook", CorrelationKey: "tr_1"}, *run.WaitingFor)
	require.Nil(t, run.DueAt, "without a timeout it is due only when a signal comes")
	due, err := c.ClaimDue(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, due)

	sig := engine.SignalParams{Name: "bank_webhook", EventID: "evt_1", CorrelationKey: "tr_1", Payload: []byte(`{"status": "paid"}`)}
	delivered, err := c.Signal(ctx, sig)
	require.NoError(t, err)
	require.True(t, delivered.Delivered)
	require.Equal(t, run.ID, delivered.RunID)
	require.False(t, delivered.Replayed)

	due, err = c.ClaimDue(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, []string{run.ID}, runIDs(due), "due at once")
	done, err := c.Continue(ctx, due[0])
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, done.Status)
	require.JSONEq(t, `"paid"`, string(done.Output))
	journal := enginetest.RequirePhases(t, c, run.ID, "requested", "bank_webhook")
	require.Equal(t, engine.KindSignal, journal[1].Kind)
	require.JSONEq(t, `{"payload":{"status":"paid"},"event_id":"evt_1"}`, string(journal[1].Output))

	// The provider redelivers the webhook: answered like the first.
	again, err := c.Signal(ctx, engine.SignalParams{Name: "bank_webhook", EventID: "evt_1", CorrelationKey: "tr_1", Payload: []byte(`{"status":"paid"}`)})
	require.NoError(t, err)
	require.Equal(t, engine.SignalResult{ID: delivered.ID, RunID: run.ID, Delivered: true, Replayed: true}, *again)
	// The same event id with another payload is refused.
	_, err = c.Signal(ctx, engine.SignalParams{Name: "bank_webhook", EventID: "evt_1", CorrelationKey: "tr_1", Payload: []byte(`{"status":"failed"}`)})
	require.ErrorIs(t, err, engine.ErrSignalMismatch)
	require.Equal(t, 1, b.countRows(t, "signals"))
}

// The webhook often beats the await: a signal sent first is kept and
// consumed when the run reaches its Await, without parking.
func TestASignalBeforeTheAwaitIsKeptAndConsumed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	registerPayout(t, workflows)
	c := b.client(t, workflows, nil)

	queued, err := c.Signal(ctx, engine.SignalParams{Name: "bank_webhook", EventID: "evt_early", CorrelationKey: "tr_2", Payload: []byte(`{"status":"paid"}`)})
	require.NoError(t, err)
	require.False(t, queued.Delivered, "nobody awaits it yet: queued")
	require.Empty(t, queued.RunID)

	res, err := c.Start(ctx, engine.StartParams{Workflow: "payout", IdempotencyKey: "po-2", Input: payoutInput("tr_2", time.Hour)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, res.Run.Status, "consumed at once")
	require.JSONEq(t, `"paid"`, string(res.Run.Output))

	// By the run's idempotency key, before the run awaits: the same.
	pending := startUnleased(t, b, c, "payout", "po-3")
	_, err = b.pool.Exec(ctx, `UPDATE ratchet.runs SET input = $2 WHERE id = $1`, pending.ID, payoutInput("tr_3", 0))
	require.NoError(t, err)
	byKey, err := c.Signal(ctx, engine.SignalParams{Name: "bank_webhook", EventID: "evt_3", IdempotencyKey: "po-3", Payload: []byte(`{"status":"returned"}`)})
	require.NoError(t, err)
	require.Equal(t, pending.ID, byKey.RunID)
	require.False(t, byKey.Delivered)
	done, err := c.TakeOver(ctx, pending.ID)
	require.NoError(t, err)
	require.JSONEq(t, `"returned"`, string(done.Output))
}

func TestAnAwaitTimesOutIntoItsOwnOutcomeReplayedIdentically(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	registerPayout(t, workflows)
	c := b.client(t, workflows, nil)

	res, err := c.Start(ctx, engine.StartParams{Workflow: "payout", IdempotencyKey: "po", Input: payoutInput("tr", 50*time.Millisecond)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, res.Run.Status)
	until := *res.Run.WaitingFor.Until
	require.True(t, until.Equal(*res.Run.DueAt), "due at its timeout")

	// Woken at the timeout, the process dies as the timeout is journaled;
	// its successor replays the same outcome.
	var due []*engine.Run
	require.Eventually(t, func() bool { // due once the database's clock passes the timeout
		due, err = c.ClaimDue(ctx, 1)
		require.NoError(t, err)
		return len(due) == 1
	}, 10*time.Second, 10*time.Millisecond)
	_, err = c.Continue(enginetest.CrashAfter(ctx, "bank_webhook"), due[0])
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	b.expireLease(t, res.Run.ID)
	done, err := b.client(t, workflows, nil).TakeOver(ctx, res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, done.Status)
	require.Equal(t, "payout_timed_out", done.Error.Code)
	journal := enginetest.RequirePhases(t, c, res.Run.ID, "requested", "bank_webhook")
	require.JSONEq(t, `{"timed_out":true}`, string(journal[1].Output))

	// A webhook after the timeout is reported, not lost: kept, unconsumed.
	_, err = c.Signal(ctx, engine.SignalParams{Name: "bank_webhook", EventID: "late", RunID: res.Run.ID, Payload: []byte(`{}`)})
	require.ErrorIs(t, err, engine.ErrFinished, "a finished run can consume nothing")
	late, err := c.Signal(ctx, engine.SignalParams{Name: "bank_webhook", EventID: "late", CorrelationKey: "tr", Payload: []byte(`{}`)})
	require.NoError(t, err)
	require.False(t, late.Delivered)
	_, err = c.Signal(ctx, engine.SignalParams{Name: "bank_webhook", EventID: "must", CorrelationKey: "tr", Payload: []byte(`{}`), RequireMatch: true})
	require.ErrorIs(t, err, engine.ErrNoMatch)
	require.Equal(t, 1, b.countRows(t, "signals"), "the refused one stored nothing")
}

// The signal and the timeout race through the Await's commit: whichever
// order they come in, exactly one is journaled, and a signal that lost
// stays unconsumed.
func TestASignalRacingTheTimeoutHasExactlyOneOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	registerPayout(t, workflows)
	c := b.client(t, workflows, nil)

	const trials = 45
	outcomes := map[string]int{}
	for i := range trials {
		id := fmt.Sprint("tr_", i)
		res, err := c.Start(ctx, engine.StartParams{Workflow: "payout", IdempotencyKey: id, Input: payoutInput(id, 20*time.Millisecond)})
		require.NoError(t, err)
		require.Equal(t, engine.StatusWaiting, res.Run.Status)
		// When each side comes, after the park, against the 20ms timeout:
		// the webhook well before, both just after it (a true race), or
		// the timer well before the webhook.
		delays := [][2]time.Duration{{0, 25 * time.Millisecond}, {22 * time.Millisecond, 22 * time.Millisecond}, {200 * time.Millisecond, 25 * time.Millisecond}}[i%3]
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { // the webhook
			defer wg.Done()
			time.Sleep(delays[0])
			_, err := c.Signal(ctx, engine.SignalParams{Name: "bank_webhook", EventID: id, CorrelationKey: id, Payload: []byte(`{"status":"paid"}`)})
			require.NoError(t, err)
		}()
		go func() { // the timer's executor
			defer wg.Done()
			time.Sleep(delays[1])
			_, err := c.TakeOver(ctx, res.Run.ID)
			require.NoError(t, err)
		}()
		wg.Wait()
		run, err := c.GetRun(ctx, res.Run.ID)
		require.NoError(t, err)
		for !run.Status.Finished() { // woken by the signal after a park: continue it
			run, err = c.TakeOver(ctx, run.ID)
			require.NoError(t, err)
		}
		var consumed *string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT consumed_by FROM ratchet.signals WHERE event_id = $1`, id).Scan(&consumed))
		journal := enginetest.RequirePhases(t, c, run.ID, "requested", "bank_webhook")
		switch run.Status {
		case engine.StatusSucceeded:
			require.NotNil(t, consumed)
			require.Equal(t, run.ID, *consumed)
			require.Contains(t, string(journal[1].Output), `"payload"`)
			outcomes["signal"]++
		case engine.StatusFailed:
			require.Equal(t, "payout_timed_out", run.Error.Code)
			require.Nil(t, consumed, "the signal that lost is kept, unconsumed")
			require.JSONEq(t, `{"timed_out":true}`, string(journal[1].Output))
			outcomes["timeout"]++
		default:
			t.Fatalf("run %s is %s", run.ID, run.Status)
		}
	}
	t.Logf("outcomes over %d trials: %v", trials, outcomes)
	require.Equal(t, trials, outcomes["signal"]+outcomes["timeout"])
	require.NotZero(t, outcomes["signal"], "a webhook well before the timeout wins")
	require.NotZero(t, outcomes["timeout"], "a timer well before the webhook wins")
}

func TestTenantsCannotSignalEachOthersRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	registerPayout(t, workflows)
	c := b.client(t, workflows, nil)
	res, err := c.Start(ctx, engine.StartParams{Workflow: "payout", IdempotencyKey: "po", Input: payoutInput("tr_a", 0), StartOpts: engine.StartOpts{Tenant: "a"}})
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, res.Run.Status)

	_, err = c.Signal(ctx, engine.SignalParams{Tenant: "b", Name: "bank_webhook", EventID: "e1", RunID: res.Run.ID, Payload: []byte(`{}`)})
	require.ErrorIs(t, err, engine.ErrRunNotFound, "by id")
	_, err = c.Signal(ctx, engine.SignalParams{Tenant: "b", Name: "bank_webhook", EventID: "e2", IdempotencyKey: "po", Payload: []byte(`{}`)})
	require.ErrorIs(t, err, engine.ErrRunNotFound, "by key")
	byKey, err := c.Signal(ctx, engine.SignalParams{Tenant: "b", Name: "bank_webhook", EventID: "e3", CorrelationKey: "tr_a", Payload: []byte(`{}`)})
	require.NoError(t, err)
	require.False(t, byKey.Delivered, "tenant b's correlation key is not tenant a's")
	due, err := c.ClaimDue(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, due, "tenant a's run was not woken")
}

func TestBadSignalsAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, engine.NewWorkflows(), nil)
	for name, p := range map[string]engine.SignalParams{
		"no address":      {Name: "s", EventID: "e", Payload: []byte(`{}`)},
		"two addresses":   {Name: "s", EventID: "e", RunID: "01JD7Q4YB3M6N5P8R9S0T1V2W3", CorrelationKey: "k", Payload: []byte(`{}`)},
		"no event id":     {Name: "s", CorrelationKey: "k", Payload: []byte(`{}`)},
		"bad name":        {Name: "a b", EventID: "e", CorrelationKey: "k", Payload: []byte(`{}`)},
		"bad payload":     {Name: "s", EventID: "e", CorrelationKey: "k", Payload: []byte(`{`)},
		"duplicate names": {Name: "s", EventID: "e", CorrelationKey: "k", Payload: []byte(`{"a":1,"a":2}`)},
	} {
		_, err := c.Signal(context.Background(), p)
		require.ErrorIs(t, err, engine.ErrInvalidSignal, name)
	}
	_, err := c.Signal(context.Background(), engine.SignalParams{Name: "s", EventID: "e", RunID: "nope", Payload: []byte(`{}`)})
	require.ErrorIs(t, err, engine.ErrRunNotFound)
}

// A process that dies right after its Await consumed a signal: the
// successor replays the same payload, and the signal is consumed once.
func TestAConsumedSignalIsReplayedAfterACrash(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflows := engine.NewWorkflows()
	registerPayout(t, workflows)
	c := b.client(t, workflows, nil)
	_, err := c.Signal(ctx, engine.SignalParams{Name: "bank_webhook", EventID: "evt", CorrelationKey: "tr", Payload: []byte(`{"status":"paid"}`)})
	require.NoError(t, err)

	res, err := c.Start(enginetest.CrashAfter(ctx, "bank_webhook"), engine.StartParams{Workflow: "payout", IdempotencyKey: "po", Input: payoutInput("tr", 0)})
	require.ErrorIs(t, err, enginetest.ErrCrashed)
	// The provider redelivers meanwhile: a no-op.
	again, err := c.Signal(ctx, engine.SignalParams{Name: "bank_webhook", EventID: "evt", CorrelationKey: "tr", Payload: []byte(`{"status":"paid"}`)})
	require.NoError(t, err)
	require.True(t, again.Replayed)

	b.expireLease(t, res.Run.ID)
	done, err := b.client(t, workflows, nil).TakeOver(ctx, res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, done.Status)
	require.JSONEq(t, `"paid"`, string(done.Output))
	var consumed int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.signals WHERE consumed_by = $1`, res.Run.ID).Scan(&consumed))
	require.Equal(t, 1, consumed)
	require.Equal(t, 1, b.countRows(t, "signals"))
}
