package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/steps"
)

// sagaOrder is the saga the compensation tests run: stock reserved (undone by
// a release), a charge (undone by a refund under its own child key), then
// the ledger — the pivot — and, past it, an optional wait for shipping.
type sagaOrder struct {
	Customer     string `json:"customer"`
	RefuseLedger bool   `json:"refuse_ledger,omitempty"`
	LedgerDown   bool   `json:"ledger_down,omitempty"`
	AwaitShipped bool   `json:"await_shipped,omitempty"`
}

type sagaBundle struct {
	*testBundle
	gateway *fakes.Gateway
	c       *engine.Client
	// charging, when set, receives a value once the charge has happened
	// at the gateway, and the step then waits for proceed.
	charging, proceed chan struct{}
	// dropRefunds is how many refund answers to lose after the gateway
	// has refunded.
	dropRefunds atomic.Int32
}

func setupSaga(t *testing.T, cfg *engine.Config) *sagaBundle {
	t.Helper()
	b := &sagaBundle{testBundle: setup(t), gateway: fakes.NewGateway(nil)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/refunds" && b.dropRefunds.Add(-1) >= 0 {
			b.gateway.ServeHTTP(httptest.NewRecorder(), r) // refunded; the answer is lost
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		b.gateway.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	gw := &fakes.GatewayClient{BaseURL: srv.URL, HTTP: steps.NewClient(nil)}
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "order", func(ctx context.Context, in sagaOrder) (string, error) {
		if _, err := engine.Atomic(ctx, "stock_reserved", func(ctx context.Context, tx pgx.Tx) (int, error) {
			return bump(ctx, tx, "reserved")
		}, &engine.AtomicOpts[int]{Compensate: func(ctx context.Context, tx pgx.Tx, _ int) error {
			_, err := bump(ctx, tx, "released")
			return err
		}}); err != nil {
			return "", err
		}
		ch, err := engine.Step(ctx, "charge_created", func(ctx context.Context, _ steps.Key) (fakes.Charge, error) {
			ch, err := gw.Charge(ctx, fakes.ChargeRequest{Amount: 1000, Currency: "usd", Customer: in.Customer})
			if err == nil && b.charging != nil {
				b.charging <- struct{}{}
				<-b.proceed
			}
			return ch, err
		}, &engine.StepOpts[fakes.Charge]{Policy: &fastRetries, Compensate: func(ctx context.Context, key steps.Key, ch fakes.Charge) error {
			_, err := gw.Refund(ctx, key, ch.ID)
			return err
		}})
		if err != nil {
			return "", err
		}
		if _, err := engine.Atomic(ctx, "ledger_posted", func(ctx context.Context, tx pgx.Tx) (int, error) {
			switch {
			case in.RefuseLedger:
				return 0, steps.Permanent("account_closed", errors.New("the customer's ledger account is closed"))
			case in.LedgerDown:
				return 0, errors.New("the ledger is down")
			}
			return bump(ctx, tx, "posted")
		}, &engine.AtomicOpts[int]{Pivot: true}); err != nil {
			return "", err
		}
		if in.AwaitShipped {
			if _, err := engine.Await[string](ctx, "shipped", nil); err != nil {
				return "", err
			}
		}
		return ch.ID, nil
	}, &engine.WorkflowOpts{ErrorStatuses: map[string]int{"account_closed": 409}, Retry: &engine.RetryPolicy{InitialInterval: time.Hour, MaxInterval: time.Hour}})
	require.NoError(t, err)
	b.c = b.client(t, workflows, cfg)
	return b
}

func (b *sagaBundle) start(t *testing.T, ctx context.Context, key string, in sagaOrder) *engine.Run {
	t.Helper()
	input, err := json.Marshal(in)
	require.NoError(t, err)
	res, err := b.c.Start(ctx, engine.StartParams{Workflow: "order", IdempotencyKey: key, Input: input})
	if !errors.Is(err, enginetest.ErrCrashed) {
		require.NoError(t, err)
	}
	return res.Run
}

func phaseNames(t *testing.T, c *engine.Client, runID string) []string {
	t.Helper()
	phases, err := c.Phases(context.Background(), runID)
	require.NoError(t, err)
	var names []string
	for _, p := range phases {
		names = append(names, p.Name)
	}
	return names
}

// requireCompensated checks a run the ledger refused: one charge, one
// refund under the undo's own child key, the stock released once, the
// ledger never posted, the cause stored and what was undone recorded.
func (b *sagaBundle) requireCompensated(t *testing.T, runID string, cause string) {
	t.Helper()
	run, err := b.c.GetRun(context.Background(), runID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompensated, run.Status)
	require.Equal(t, cause, run.Error.Code)
	require.JSONEq(t, `{"compensated": ["charge_created", "stock_reserved"]}`, string(run.Output))
	require.Equal(t, []string{"stock_reserved", "charge_created", "ledger_posted", "undo", "undo:charge_created", "undo:stock_reserved"}, phaseNames(t, b.c, runID))

	stats := b.gateway.Stats()
	require.Equal(t, 1, stats.Charges)
	require.Equal(t, 1, stats.Refunds, "exactly one refund")
	undoKey := childKey(t, run, "undo:charge_created")
	require.Equal(t, map[string]int{undoKey: 1}, stats.RefundsByKey, "under the undo's own child key")
	require.NotContains(t, stats.RefundsByKey, childKey(t, run, "charge_created"))
	require.Equal(t, 1, b.counter(t, "released"))
	require.Equal(t, 0, b.counter(t, "posted"))
}

func TestPermanentFailureBeforeThePivotCompensatesNewestFirst(t *testing.T) {
	t.Parallel()
	b := setupSaga(t, nil)
	ctx := context.Background()
	run := b.start(t, ctx, "o-1", sagaOrder{Customer: "cus_1", RefuseLedger: true})
	b.requireCompensated(t, run.ID, "account_closed")
	require.Equal(t, 409, *run.ResponseStatus, "the cause's status")

	phases, err := b.c.Phases(ctx, run.ID)
	require.NoError(t, err)
	require.True(t, phases[0].Compensable && phases[1].Compensable)
	require.Equal(t, "account_closed", phases[2].Error.Code, "the refusal is journaled, so a replay takes the same branch")
	require.Equal(t, engine.KindCompensation, phases[3].Kind)
	require.JSONEq(t, `{"cause": {"code": "account_closed", "message": "the customer's ledger account is closed", "retryable": false}}`, string(phases[3].Output))
	require.Equal(t, childKey(t, run, "undo:charge_created"), *phases[4].ChildKey)

	// The same key again is the stored result, not a second saga.
	again, err := b.c.Start(ctx, engine.StartParams{Workflow: "order", IdempotencyKey: "o-1", Input: []byte(`{"customer": "cus_1", "refuse_ledger": true}`)})
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeFinished, again.Outcome)
	require.Equal(t, run.Output, again.Run.Output)
	require.Equal(t, 1, b.gateway.Stats().Refunds)
}

// A crash after every boundary of the saga — the charge, the decision to
// compensate, the refund, the release — leaves a run that a takeover
// finishes with exactly one refund.
func TestCompensationSurvivesACrashAtEveryBoundary(t *testing.T) {
	t.Parallel()
	for _, point := range []string{"charge_created", "undo", "undo:charge_created", "undo:stock_reserved"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			b := setupSaga(t, nil)
			ctx := context.Background()
			run := b.start(t, enginetest.CrashAfter(ctx, point), "o-1", sagaOrder{Customer: "cus_1", RefuseLedger: true})
			require.False(t, run.Status.Finished())
			b.expireLease(t, run.ID)
			other := setupSagaClient(t, b)
			_, err := other.TakeOver(ctx, run.ID)
			require.NoError(t, err)
			b.requireCompensated(t, run.ID, "account_closed")
		})
	}
}

// setupSagaClient is another process over the saga's database: the same
// workflows, a client of its own.
func setupSagaClient(t *testing.T, b *sagaBundle) *engine.Client {
	t.Helper()
	return b.client(t, b.c.Workflows(), nil)
}

// A refund whose answer is lost after the gateway refunded is repeated
// with its key: one refund.
func TestALostRefundAnswerIsRepeatedWithItsKey(t *testing.T) {
	t.Parallel()
	b := setupSaga(t, nil)
	b.dropRefunds.Store(1)
	run := b.start(t, context.Background(), "o-1", sagaOrder{Customer: "cus_1", RefuseLedger: true})
	b.requireCompensated(t, run.ID, "account_closed")
	require.EqualValues(t, -1, b.dropRefunds.Load(), "the refund was sent twice (net/http repeats a request with an Idempotency-Key by itself), with one key")
}

func TestCancelDuringTheChargeJournalsItThenRefundsOnce(t *testing.T) {
	t.Parallel()
	b := setupSaga(t, nil)
	b.charging, b.proceed = make(chan struct{}, 1), make(chan struct{})
	ctx := context.Background()
	done := make(chan *engine.Run, 1)
	go func() { done <- b.start(t, ctx, "o-1", sagaOrder{Customer: "cus_1"}) }()
	receive(t, b.charging) // charged at the gateway, not yet journaled

	cancelled, err := b.c.Cancel(ctx, b.runIDForKey(t, "o-1"))
	require.NoError(t, err)
	require.Equal(t, engine.CancelRequested, cancelled.Outcome, "a live executor holds it")
	close(b.proceed)

	run := receive(t, done)
	require.Equal(t, engine.StatusCompensated, run.Status)
	require.Equal(t, engine.CodeCancelled, run.Error.Code)
	require.Nil(t, run.ResponseStatus, "answered as a cancelled run is")
	require.Equal(t, []string{"stock_reserved", "charge_created", "undo", "undo:charge_created", "undo:stock_reserved"}, phaseNames(t, b.c, run.ID),
		"the charge's result is journaled, then undone")
	stats := b.gateway.Stats()
	require.Equal(t, 1, stats.Charges)
	require.Equal(t, 1, stats.Refunds)
	require.Equal(t, 0, b.counter(t, "posted"), "the pivot was refused")
}

// A run nobody holds, with a charge to undo, is not cancelled on the spot:
// the cancellation makes it due, and whoever takes it compensates.
func TestCancelOfAnUnheldRunWithUndosCompensates(t *testing.T) {
	t.Parallel()
	b := setupSaga(t, nil)
	ctx := context.Background()
	run := b.start(t, ctx, "o-1", sagaOrder{Customer: "cus_1", LedgerDown: true})
	require.Equal(t, engine.StatusPending, run.Status, "released to retry in an hour")

	res, err := b.c.Cancel(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.CancelCompensates, res.Outcome)
	require.NotNil(t, res.Run.DueAt)
	claimed, err := setupSagaClient(t, b).ClaimDue(ctx, 10)
	require.NoError(t, err)
	require.Len(t, claimed, 1, "due at once, not in an hour")
	_, err = b.c.TakeOver(ctx, run.ID) // the claim above is a second process's; this one waits for nothing
	require.ErrorIs(t, err, engine.ErrLeaseHeld)
	b.expireLease(t, run.ID)
	final, err := b.c.TakeOver(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompensated, final.Status)
	require.Equal(t, 1, b.gateway.Stats().Refunds)
	require.Equal(t, 1, b.counter(t, "released"))
}

func TestCancelPastThePivotIsRefused(t *testing.T) {
	t.Parallel()
	b := setupSaga(t, nil)
	ctx := context.Background()
	run := b.start(t, ctx, "o-1", sagaOrder{Customer: "cus_1", AwaitShipped: true})
	require.Equal(t, engine.StatusWaiting, run.Status)
	require.Equal(t, "ledger_posted", *run.Pivot)

	_, err := b.c.Cancel(ctx, run.ID)
	var past *engine.PastPivotError
	require.ErrorAs(t, err, &past)
	require.ErrorIs(t, err, engine.ErrPastPivot)
	require.Equal(t, "ledger_posted", past.Pivot)
	again, err := b.c.GetRun(ctx, run.ID)
	require.NoError(t, err)
	require.Nil(t, again.CancelRequestedAt, "nothing changed")
	require.Equal(t, 0, b.gateway.Stats().Refunds)
}

// A failure after the pivot is retried forward, never compensated.
func TestNoCompensationPastThePivot(t *testing.T) {
	t.Parallel()
	b := setupSaga(t, nil)
	workflows := b.c.Workflows()
	_, err := engine.Register(workflows, "after-pivot", func(ctx context.Context, _ struct{}) (string, error) {
		if _, err := engine.Atomic(ctx, "held", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "held") },
			&engine.AtomicOpts[int]{Compensate: func(ctx context.Context, tx pgx.Tx, _ int) error { _, err := bump(ctx, tx, "unheld"); return err }}); err != nil {
			return "", err
		}
		if _, err := engine.Atomic(ctx, "kept", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "kept") },
			&engine.AtomicOpts[int]{Pivot: true}); err != nil {
			return "", err
		}
		return "", steps.Permanent("late_refusal", errors.New("refused after the pivot"))
	}, nil)
	require.NoError(t, err)
	res, err := b.c.Start(context.Background(), engine.StartParams{Workflow: "after-pivot", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Run.Status)
	require.Equal(t, 0, b.counter(t, "unheld"))
}

// A refund the gateway refuses for good parks the run, compensating, for
// an operator: not failed, not retried, visibly stuck. Once the cause is
// mended, resuming it finishes the compensation.
func TestACompensationThatKeepsFailingIsStuckUntilResumed(t *testing.T) {
	t.Parallel()
	b := setupSaga(t, nil)
	ctx := context.Background()
	b.gateway.SetFaults(fakes.Faults{RefuseRefunds: true})
	run := b.start(t, ctx, "o-1", sagaOrder{Customer: "cus_1", RefuseLedger: true})
	require.Equal(t, engine.StatusCompensating, run.Status)
	require.NotNil(t, run.WaitingFor)
	require.Equal(t, engine.KindCompensation, run.WaitingFor.Kind)
	require.Equal(t, "undo:charge_created", run.WaitingFor.Phase)
	require.Equal(t, "http_400", run.WaitingFor.Error.Code)
	require.NotEmpty(t, run.WaitingFor.Reason)
	require.Nil(t, run.DueAt, "never due until an operator resumes it")
	require.Nil(t, run.FinishedAt)
	claimed, err := b.c.ClaimDue(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, claimed)
	require.Equal(t, 0, b.counter(t, "released"), "undos run newest first: the release waits for the refund")
	cancelled, err := b.c.Cancel(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.CancelCompensates, cancelled.Outcome, "it is compensating already")
	require.Nil(t, cancelled.Run.DueAt, "a cancel does not unpark it: the operator does")

	b.gateway.SetFaults(fakes.Faults{})
	reopened, err := b.c.Reopen(ctx, run.ID)
	require.NoError(t, err)
	require.True(t, reopened.WaitingFor.Resolved)
	claimed, err = b.c.ClaimDue(ctx, 10)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	final, err := b.c.Continue(ctx, claimed[0])
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompensated, final.Status)
	b.requireCompensated(t, run.ID, "account_closed")
}

// A refund that fails retryably is retried — with backoff, for as long as
// it takes, whatever the run's retry policy — and the run stays
// compensating meanwhile.
func TestACompensationThatFailsRetryablyIsRetriedUntilItSucceeds(t *testing.T) {
	t.Parallel()
	b := setupSaga(t, nil)
	ctx := context.Background()
	b.gateway.SetFaults(fakes.Faults{RefundsDown: true})
	run := b.start(t, ctx, "o-1", sagaOrder{Customer: "cus_1", RefuseLedger: true})
	for range 3 {
		require.Equal(t, engine.StatusCompensating, run.Status)
		require.NotNil(t, run.NextAttemptAt, "backing off")
		require.Equal(t, engine.CodeStepExhausted, run.Error.Code, "the last error is the refund's")
		var err error
		run, err = b.c.TakeOver(ctx, run.ID)
		require.NoError(t, err)
	}
	b.gateway.SetFaults(fakes.Faults{})
	run, err := b.c.TakeOver(ctx, run.ID)
	require.NoError(t, err)
	b.requireCompensated(t, run.ID, "account_closed")
}

// A run that compensates has its reasons in its journal: a build whose
// code no longer registers an undo the journal says was registered parks
// the run rather than skip it.
func TestAMissingUndoParksTheCompensation(t *testing.T) {
	t.Parallel()
	b := setupSaga(t, nil)
	ctx := context.Background()
	run := b.start(t, enginetest.CrashAfter(ctx, "undo"), "o-1", sagaOrder{Customer: "cus_1", RefuseLedger: true})
	b.expireLease(t, run.ID)

	// The new build forgot the refund.
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "order", func(ctx context.Context, in sagaOrder) (string, error) {
		if _, err := engine.Atomic(ctx, "stock_reserved", func(ctx context.Context, tx pgx.Tx) (int, error) { return 0, nil },
			&engine.AtomicOpts[int]{Compensate: func(context.Context, pgx.Tx, int) error { return nil }}); err != nil {
			return "", err
		}
		_, err := engine.Step(ctx, "charge_created", func(ctx context.Context, _ steps.Key) (fakes.Charge, error) { return fakes.Charge{}, nil }, nil)
		return "", err
	}, nil)
	require.NoError(t, err)
	parked, err := b.client(t, workflows, nil).TakeOver(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompensating, parked.Status)
	require.Equal(t, engine.KindCompensation, parked.WaitingFor.Kind)
	require.Contains(t, parked.WaitingFor.Reason, `"charge_created"`)
	require.Equal(t, 0, b.gateway.Stats().Refunds)
}

func TestPhaseNamesOfCompensationAreReserved(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	for i, name := range []string{"undo", "undo:charge"} {
		_, err := engine.Register(workflows, fmt.Sprintf("w%d", i), func(ctx context.Context, _ struct{}) (int, error) {
			return engine.Atomic(ctx, name, func(context.Context, pgx.Tx) (int, error) { return 1, nil }, nil)
		}, nil)
		require.NoError(t, err)
	}
	c := b.client(t, workflows, nil)
	for i := range 2 {
		res, err := c.Start(context.Background(), engine.StartParams{Workflow: fmt.Sprintf("w%d", i), IdempotencyKey: fmt.Sprint("k", i), Input: []byte(`{}`)})
		require.NoError(t, err)
		require.Equal(t, engine.StatusFailed, res.Run.Status)
		require.Equal(t, engine.CodeInvalidPhase, res.Run.Error.Code)
	}
}

// A run whose retry policy gives up compensates like one that failed
// permanently, with retries_exhausted as its cause.
func TestARetryPolicyThatGivesUpCompensates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "flaky", func(ctx context.Context, _ struct{}) (int, error) {
		if _, err := engine.Atomic(ctx, "held", func(ctx context.Context, tx pgx.Tx) (int, error) { return bump(ctx, tx, "held") },
			&engine.AtomicOpts[int]{Compensate: func(ctx context.Context, tx pgx.Tx, _ int) error { _, err := bump(ctx, tx, "unheld"); return err }}); err != nil {
			return 0, err
		}
		return engine.Atomic(ctx, "confirmed", func(context.Context, pgx.Tx) (int, error) { return 0, errors.New("the downstream is down") }, nil)
	}, &engine.WorkflowOpts{Retry: &engine.RetryPolicy{MaxAttempts: 2, InitialInterval: time.Hour}})
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	ctx := context.Background()
	res, err := c.Start(ctx, engine.StartParams{Workflow: "flaky", IdempotencyKey: "k", Input: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, res.Run.Status, "the first failure is retried")
	run, err := c.TakeOver(ctx, res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompensated, run.Status)
	require.Equal(t, engine.CodeRetriesExhausted, run.Error.Code)
	require.Equal(t, 1, b.counter(t, "unheld"))
	require.Equal(t, 1, b.counter(t, "held"))
}
