package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/fakes"
)

type sagaRun struct {
	ID           string          `json:"id"`
	Status       string          `json:"status"`
	Cancellation string          `json:"cancellation"`
	Pivot        string          `json:"pivot"`
	Output       json.RawMessage `json:"output"`
	WaitingFor   *struct {
		Kind   string `json:"kind"`
		Phase  string `json:"phase"`
		Reason string `json:"reason"`
		Error  struct {
			Code string `json:"code"`
		} `json:"error"`
		Resolved bool `json:"resolved"`
	} `json:"waiting_for"`
	Phases []struct {
		Name        string  `json:"name"`
		Kind        string  `json:"kind"`
		ChildKey    *string `json:"child_key"`
		Compensable bool    `json:"compensable"`
	} `json:"phases"`
}

func (b *testBundle) sagaRun(t *testing.T, id string) sagaRun {
	t.Helper()
	r := b.do(t, http.MethodGet, "/v1/runs/"+id, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	return decode[sagaRun](t, r)
}

// A compensated run answers with its cause and what was undone, and a
// replay answers the same bytes.
func TestACompensatedRunIsAnsweredWithItsCauseAndReplayedByteForByte(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := b.start(t, "saga", "s1", `{"customer":"cus_closed","amount":5}`)
	p := requireProblem(t, first, http.StatusConflict, "account_closed")
	require.NotEmpty(t, p.RunID)
	var body struct {
		Compensated []string `json:"compensated"`
		Title       string   `json:"title"`
	}
	require.NoError(t, json.Unmarshal(first.body, &body))
	require.Equal(t, []string{"charged"}, body.Compensated)
	require.Contains(t, body.Title, "undone")

	again := b.start(t, "saga", "s1", `{"customer":"cus_closed","amount":5}`)
	require.Equal(t, first.status, again.status)
	require.Equal(t, string(first.body), string(again.body), "byte for byte")
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))

	run := b.sagaRun(t, p.RunID)
	require.Equal(t, "compensated", run.Status)
	var names []string
	for _, ph := range run.Phases {
		names = append(names, ph.Name)
	}
	require.Equal(t, []string{"charged", "ledger_posted", "undo", "undo:charged"}, names)
	require.True(t, run.Phases[0].Compensable)
	require.NotEqual(t, *run.Phases[0].ChildKey, *run.Phases[3].ChildKey, "the refund has a key of its own")
	require.Equal(t, 1, b.gateway.Stats().Refunds)

	list := b.do(t, http.MethodGet, "/v1/runs?status=compensated", "")
	require.Equal(t, http.StatusOK, list.status, "%s", list)
	page := decode[struct {
		Data []sagaRun `json:"data"`
	}](t, list)
	require.Len(t, page.Data, 1)
	require.Equal(t, p.RunID, page.Data[0].ID)
}

func TestCancelSaysWhatItDoes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)

	// Before the pivot, with a charge to undo: it compensates.
	waiting := decode[sagaRun](t, b.start(t, "saga", "s1", `{"customer":"cus_1","amount":9}`))
	require.Equal(t, "waiting", waiting.Status)
	r := b.do(t, http.MethodPost, "/v1/runs/"+waiting.ID+"/cancel", "")
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	require.Equal(t, "compensates", decode[sagaRun](t, r).Cancellation)
	_, err := b.engine.TakeOver(context.Background(), waiting.ID) // a worker would, at once
	require.NoError(t, err)
	require.Equal(t, "compensated", b.sagaRun(t, waiting.ID).Status)
	require.Equal(t, 1, b.gateway.Stats().Refunds)

	// Past the pivot: refused, with the pivot named.
	shipped := decode[sagaRun](t, b.start(t, "saga", "s2", `{"customer":"cus_1","amount":7}`))
	require.Equal(t, "waiting", shipped.Status)
	require.Equal(t, "ledger_posted", shipped.Pivot)
	p := requireProblem(t, b.do(t, http.MethodPost, "/v1/runs/"+shipped.ID+"/cancel", ""), http.StatusConflict, "past_pivot")
	require.Contains(t, p.Detail, "ledger_posted")

	// Nothing to undo: cancelled at once.
	nap := decode[sagaRun](t, b.start(t, "nap", "n1", `{"value":"a"}`))
	r = b.do(t, http.MethodPost, "/v1/runs/"+nap.ID+"/cancel", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	require.Equal(t, "cancelled", decode[sagaRun](t, r).Cancellation)
}

// A refund the gateway refuses leaves the run compensating, parked with
// the refusal for an operator; resuming it once the cause is mended
// finishes it.
func TestAStuckCompensationIsShownAndResumedOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.gateway.SetFaults(fakes.Faults{RefuseRefunds: true})
	r := b.start(t, "saga", "s1", `{"customer":"cus_closed","amount":5}`)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	run := b.sagaRun(t, decode[sagaRun](t, r).ID)
	require.Equal(t, "compensating", run.Status)
	require.NotNil(t, run.WaitingFor)
	require.Equal(t, "compensation", run.WaitingFor.Kind)
	require.Equal(t, "undo:charged", run.WaitingFor.Phase)
	require.Equal(t, "http_400", run.WaitingFor.Error.Code)
	require.NotEmpty(t, run.WaitingFor.Reason)

	b.gateway.SetFaults(fakes.Faults{})
	r = b.do(t, http.MethodPost, "/v1/runs/"+run.ID+"/resume", "")
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	require.Eventually(t, func() bool { return b.sagaRun(t, run.ID).Status == string(engine.StatusCompensated) }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, b.gateway.Stats().Refunds)
}
