package payouts_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/api"
	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/examples/payouts"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/recovery"
	"github.com/ratchet-run/ratchet/worker"
)

// finished receives the status of every execution that finishes a run.
type finished chan engine.Status

func (f finished) Run(ctx context.Context, _ engine.RunInfo) (context.Context, func(engine.RunEnd)) {
	return ctx, func(end engine.RunEnd) {
		if end.Status.Finished() {
			f <- end.Status
		}
	}
}

func (f finished) Phase(ctx context.Context, _ engine.PhaseInfo) (context.Context, func(error)) {
	return ctx, func(error) {}
}

// The payout against a fake bank whose settlement webhook comes later,
// twice, before the await, or never; the service is the API with its
// worker, as deployed, and the webhook goes through the API.
func TestPayoutAwaitsTheBanksWebhook(t *testing.T) {
	t.Parallel()
	for name, hooks := range map[string]fakes.Webhooks{
		"later": {Delay: 50 * time.Millisecond},
		"twice": {Delay: 20 * time.Millisecond, Twice: true},
		"early": {Early: true},
		"never": {Drop: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := enginetest.New(t, nil)
			require.NoError(t, payouts.Setup(ctx, db.Pool))

			// The bank's webhooks go to the API, whose URL is known once it
			// serves; the bank is made then.
			var bank *fakes.Bank
			bankSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { bank.ServeHTTP(w, r) }))
			t.Cleanup(bankSrv.Close)
			p, err := payouts.New(payouts.Config{BankURL: bankSrv.URL, SettleTimeout: 300 * time.Millisecond})
			require.NoError(t, err)
			workflows := engine.NewWorkflows()
			_, err = p.Register(workflows)
			require.NoError(t, err)
			done := make(finished, 1)
			w, err := worker.New(db.Pool, &worker.Config{
				Engine:   engine.Config{Workflows: workflows, Hooks: done},
				Recovery: recovery.Config{PollInterval: 20 * time.Millisecond},
			})
			require.NoError(t, err)
			require.NoError(t, w.Start(ctx))
			t.Cleanup(func() {
				if bank != nil {
					bank.Wait()
				}
				stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				require.NoError(t, w.Stop(stopCtx))
			})
			h, err := api.New(&api.Config{Engine: w.Engine()})
			require.NoError(t, err)
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			apiURL := srv.URL
			bank = fakes.NewBank(fakes.BankOpts{Webhooks: hooks, WebhookURL: apiURL + "/v1/signals/" + payouts.SignalSettled})

			req, _ := http.NewRequest(http.MethodPost, apiURL+"/v1/workflows/payout/runs", strings.NewReader(`{"amount": 5000, "account": "acct_1"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "payout-1")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			var started struct {
				ID string `json:"id"`
			}
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&started))
			resp.Body.Close()
			require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, resp.StatusCode)

			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the payout did not finish")
			}
			run, err := w.Engine().GetRun(ctx, started.ID)
			require.NoError(t, err)
			key := enginetest.ChildKey(t, run, "transfer_requested")
			require.Equal(t, map[string]int{key: 1}, bank.Stats().TransfersByKey, "one transfer, under the step's child key")
			var recorded int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM payouts.payouts`).Scan(&recorded))

			if hooks.Drop {
				require.Equal(t, engine.StatusFailed, run.Status)
				require.Equal(t, "settlement_timed_out", run.Error.Code)
				require.Equal(t, http.StatusGatewayTimeout, *run.ResponseStatus)
				require.Zero(t, recorded)
				return
			}
			require.Equal(t, engine.StatusSucceeded, run.Status, "%+v", run.Error)
			require.JSONEq(t, `{"transfer_id":"tr_1","status":"settled"}`, string(run.Output))
			require.Equal(t, 1, recorded, "recorded once")
			bank.Wait()
			want := 1
			if hooks.Twice {
				want = 2 // the second answered as a replay
			}
			require.Equal(t, want, bank.Stats().WebhooksSent)
			var signals int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.signals WHERE consumed_by = $1`, run.ID).Scan(&signals))
			require.Equal(t, 1, signals, "one signal consumed, however often it came")
		})
	}
}
