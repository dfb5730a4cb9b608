package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
)

type order struct {
	Amount   int    `json:"amount"`
	Customer string `json:"customer"`
}

type receipt struct {
	Total    int    `json:"total"`
	Executor string `json:"executor"`
}

// registerCharge registers a one-phase workflow whose phase bumps the
// counter named by the customer.
func registerCharge(t *testing.T, workflows *engine.Workflows, opts *engine.WorkflowOpts) *engine.Workflow[order, receipt] {
	t.Helper()
	wf, err := engine.Register(workflows, "charge", func(ctx context.Context, in order) (receipt, error) {
		n, err := engine.Atomic(ctx, "charged", func(ctx context.Context, tx pgx.Tx) (int, error) {
			return bump(ctx, tx, in.Customer)
		}, nil)
		if err != nil {
			return receipt{}, err
		}
		return receipt{Total: in.Amount * n}, nil
	}, opts)
	require.NoError(t, err)
	return wf
}

func TestStartSameKeyConcurrentlyExecutesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	wf := registerCharge(t, workflows, nil)
	c := b.client(t, workflows, nil)

	const callers = 50
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		mu       sync.Mutex
		outcomes = map[engine.Outcome]int{}
	)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := wf.Start(context.Background(), c, "order-1", order{Amount: 1299, Customer: "cus_1"}, nil)
			if !assertNoError(t, err) {
				return
			}
			if res.Outcome == engine.OutcomeFinished || res.Outcome == engine.OutcomeCreated {
				if res.Output.Total != 1299 {
					t.Errorf("caller got output %+v, want the stored result", res.Output)
				}
			}
			mu.Lock()
			outcomes[res.Outcome]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()

	t.Logf("outcomes: %v", outcomes)
	require.Equal(t, 1, b.counter(t, "cus_1"), "the side effect happened exactly once")
	require.Equal(t, 1, outcomes[engine.OutcomeCreated], "exactly one caller created the run: %v", outcomes)
	require.Equal(t, callers-1, outcomes[engine.OutcomeFinished]+outcomes[engine.OutcomeInProgress],
		"every other caller saw the stored result or the run in progress: %v", outcomes)
	require.Equal(t, 1, b.countRows(t, "runs"))
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

func TestStartFinishedKeyReplaysStoredResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	wf := registerCharge(t, workflows, nil)
	c := b.client(t, workflows, nil)
	ctx := context.Background()

	first, err := c.Start(ctx, engine.StartParams{Workflow: "charge", IdempotencyKey: "k", Input: json.RawMessage(`{"customer":"cus_1","amount":5}`)})
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeCreated, first.Outcome)
	require.Equal(t, engine.StatusSucceeded, first.Run.Status)
	require.Equal(t, "charged", first.Run.RecoveryPoint)
	require.Nil(t, first.Run.LeaseExpiresAt, "a finished run holds no lease")

	// Same input with other key order and whitespace: the same request.
	again, err := wf.Start(ctx, c, "k", order{Amount: 5, Customer: "cus_1"}, nil)
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeFinished, again.Outcome)
	require.Equal(t, first.Run.ID, again.Run.ID)
	require.Equal(t, receipt{Total: 5}, again.Output)
	require.Equal(t, 1, b.counter(t, "cus_1"))
}

func TestStartSameKeyDifferentInputIsMismatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	wf := registerCharge(t, workflows, nil)
	c := b.client(t, workflows, nil)
	ctx := context.Background()

	first, err := wf.Start(ctx, c, "k", order{Amount: 5, Customer: "cus_1"}, nil)
	require.NoError(t, err)
	before, err := c.GetRun(ctx, first.Run.ID)
	require.NoError(t, err)

	_, err = wf.Start(ctx, c, "k", order{Amount: 6, Customer: "cus_1"}, nil)
	var mismatch *engine.MismatchError
	require.ErrorAs(t, err, &mismatch)
	require.ErrorIs(t, err, engine.ErrFingerprintMismatch)
	require.Equal(t, first.Run.ID, mismatch.RunID)

	after, err := c.GetRun(ctx, first.Run.ID)
	require.NoError(t, err)
	require.Equal(t, before, after, "the stored run is untouched")
	require.Equal(t, 1, b.counter(t, "cus_1"), "nothing executed")
	require.Equal(t, 1, b.countRows(t, "runs"))
}

func TestStartRejectsBadRequestsWithoutWriting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	registerCharge(t, workflows, nil)
	c := b.client(t, workflows, nil)
	ctx := context.Background()
	good := json.RawMessage(`{"amount":1,"customer":"c"}`)

	cases := []struct {
		name string
		p    engine.StartParams
		want error
	}{
		{"empty key", engine.StartParams{Workflow: "charge", Input: good}, engine.ErrInvalidKey},
		{"key over 255 characters", engine.StartParams{Workflow: "charge", IdempotencyKey: strings.Repeat("k", 256), Input: good}, engine.ErrInvalidKey},
		{"key with a control character", engine.StartParams{Workflow: "charge", IdempotencyKey: "a\nb", Input: good}, engine.ErrInvalidKey},
		{"key not UTF-8", engine.StartParams{Workflow: "charge", IdempotencyKey: "a\xffb", Input: good}, engine.ErrInvalidKey},
		{"unknown workflow", engine.StartParams{Workflow: "refund", IdempotencyKey: "k", Input: good}, engine.ErrUnknownWorkflow},
		{"input of the wrong type", engine.StartParams{Workflow: "charge", IdempotencyKey: "k", Input: json.RawMessage(`{"amount":"lots"}`)}, engine.ErrInvalidInput},
		{"malformed input", engine.StartParams{Workflow: "charge", IdempotencyKey: "k", Input: json.RawMessage(`{"amount":`)}, engine.ErrInvalidInput},
		{"trailing data after input", engine.StartParams{Workflow: "charge", IdempotencyKey: "k", Input: json.RawMessage(`{} {}`)}, engine.ErrInvalidInput},
		{"no input", engine.StartParams{Workflow: "charge", IdempotencyKey: "k"}, engine.ErrInvalidInput},
	}
	for _, tc := range cases {
		_, err := c.Start(ctx, tc.p)
		require.ErrorIs(t, err, tc.want, tc.name)
	}
	require.Equal(t, 0, b.countRows(t, "runs"), "no bad request wrote a row")

	// The bounds are inclusive: 255 characters (multi-byte ones too) is fine.
	res, err := c.Start(ctx, engine.StartParams{Workflow: "charge", IdempotencyKey: strings.Repeat("é", 255), Input: good})
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, res.Run.Status)
}

func TestStartTxCreatesRunOnlyIfCallerCommits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	wf := registerCharge(t, workflows, nil)
	c := b.client(t, workflows, nil)
	ctx := context.Background()

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = wf.StartTx(ctx, c, tx, "k", order{Amount: 3, Customer: "cus_tx"}, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 0, b.countRows(t, "runs"), "a rolled-back StartTx leaves no run")

	tx, err = b.pool.Begin(ctx)
	require.NoError(t, err)
	res, err := wf.StartTx(ctx, c, tx, "k", order{Amount: 3, Customer: "cus_tx"}, nil)
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeCreated, res.Outcome)
	require.Equal(t, engine.StatusPending, res.Run.Status)
	require.Nil(t, res.Run.LeaseExpiresAt, "StartTx does not lease the run")
	require.Equal(t, 0, b.counter(t, "cus_tx"), "StartTx executes nothing")
	require.NoError(t, tx.Commit(ctx))

	again, err := wf.Start(ctx, c, "k", order{Amount: 3, Customer: "cus_tx"}, nil)
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeResumable, again.Outcome, "a committed, unexecuted run is resumable")

	run, err := c.TakeOver(ctx, res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, run.Status)
	require.Equal(t, 1, b.counter(t, "cus_tx"))
}

func TestRetentionSetsExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for i, tc := range []struct {
		retention, failed time.Duration
		customer          string
		want              time.Duration // 0: never expires
	}{
		{engine.Retention24h, 0, "r", 24 * time.Hour},
		{engine.Retention7d, 0, "r", 7 * 24 * time.Hour},
		{120 * 24 * time.Hour, 0, "r", 120 * 24 * time.Hour}, // a chargeback window
		{engine.RetentionForever, 0, "r", 0},
		{0, 0, "r", 24 * time.Hour}, // the default
		// A failed run keeps FailedRetention, defaulting to Retention.
		{engine.RetentionForever, engine.Retention24h, "cus_declined", 24 * time.Hour},
		{engine.Retention7d, 0, "cus_declined", 7 * 24 * time.Hour},
	} {
		workflows := engine.NewWorkflows()
		_, err := engine.Register(workflows, "charge", func(ctx context.Context, in order) (int, error) {
			if in.Customer == "cus_declined" {
				return 0, steps.Permanent("card_declined", errors.New("declined"))
			}
			return 1, nil
		}, &engine.WorkflowOpts{Retention: tc.retention, FailedRetention: tc.failed})
		require.NoError(t, err)
		c := b.client(t, workflows, nil)
		res, err := c.Start(ctx, engine.StartParams{Workflow: "charge", IdempotencyKey: fmt.Sprint("retention-", i), Input: []byte(fmt.Sprintf(`{"customer":%q}`, tc.customer))})
		require.NoError(t, err)
		run := res.Run
		require.NotNil(t, run.FinishedAt)
		if tc.want == 0 {
			require.Nil(t, run.ExpiresAt, "case %d keeps the run forever", i)
			continue
		}
		require.NotNil(t, run.ExpiresAt, "case %d", i)
		require.Equal(t, tc.want, run.ExpiresAt.Sub(*run.FinishedAt), "case %d", i)
	}
}

func TestRegisterRejectsBadDefinitions(t *testing.T) {
	t.Parallel()
	noop := func(context.Context, struct{}) (struct{}, error) { return struct{}{}, nil }
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "ok", noop, nil)
	require.NoError(t, err)

	for name, register := range map[string]func() error{
		"duplicate name":    func() error { _, err := engine.Register(workflows, "ok", noop, nil); return err },
		"empty name":        func() error { _, err := engine.Register(workflows, "", noop, nil); return err },
		"name with a space": func() error { _, err := engine.Register(workflows, "a b", noop, nil); return err },
		"nil function": func() error {
			_, err := engine.Register[struct{}, struct{}](workflows, "nil", nil, nil)
			return err
		},
		"negative retention": func() error {
			_, err := engine.Register(workflows, "r", noop, &engine.WorkflowOpts{Retention: -time.Hour})
			return err
		},
		"bad retry policy": func() error {
			_, err := engine.Register(workflows, "p", noop, &engine.WorkflowOpts{Retry: &engine.RetryPolicy{Multiplier: 0.5}})
			return err
		},
	} {
		require.Error(t, register(), name)
	}
	require.Equal(t, []string{"ok"}, workflows.Names())
}

func TestTypedStartRefusesWorkflowOfAnotherRegistry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mine, theirs := engine.NewWorkflows(), engine.NewWorkflows()
	registerCharge(t, mine, nil)
	foreign := registerCharge(t, theirs, nil)
	c := b.client(t, mine, nil)

	_, err := foreign.Start(context.Background(), c, "k", order{}, nil)
	require.True(t, errors.Is(err, engine.ErrUnknownWorkflow), "got %v", err)
	require.Equal(t, 0, b.countRows(t, "runs"))
}

func TestInputsPostgresCannotStoreAreInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "any", func(context.Context, json.RawMessage) (int, error) { return 1, nil }, nil)
	require.NoError(t, err)
	c := b.client(t, workflows, nil)
	for _, input := range []string{`{"a":"nul\u0000"}`, `{"nul\u0000key":1}`, `[1e1000000]`} {
		_, err := c.Start(context.Background(), engine.StartParams{Workflow: "any", IdempotencyKey: "k", Input: json.RawMessage(input)})
		require.ErrorIs(t, err, engine.ErrInvalidInput, input)
	}
	require.Equal(t, 0, b.countRows(t, "runs"))
}
