package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
)

type blockedJSON struct {
	Status  string `json:"status"`
	Blocked *struct {
		Reason string `json:"reason"`
		Detail string `json:"detail"`
	} `json:"blocked"`
}

// An unfinished run says what it waits for: here, a run created for a
// worker (StartTx) when no live process serves its workflow version, then
// when one does but none takes it.
func TestARunSaysWhatItWaitsFor(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	var id string
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		res, err := b.engine.StartTx(ctx, tx, engine.StartParams{Workflow: "echo", IdempotencyKey: "k", Input: []byte(`{"value":"a"}`)})
		if err == nil {
			id = res.Run.ID
		}
		return err
	}))
	get := func() blockedJSON {
		r := b.do(t, http.MethodGet, "/v1/runs/"+id, "")
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		return decode[blockedJSON](t, r)
	}
	run := get()
	require.Equal(t, "unserved", run.Blocked.Reason)
	require.Equal(t, "no live process runs echo@1: it waits until one that registers it starts", run.Blocked.Detail)
	require.NoError(t, b.engine.Announce(ctx, time.Minute))
	require.Equal(t, "due", get().Blocked.Reason)

	list := b.do(t, http.MethodGet, "/v1/runs?blocked=due", "")
	require.Equal(t, http.StatusOK, list.status, "%s", list)
	page := decode[struct {
		Data []blockedJSON `json:"data"`
	}](t, list)
	require.Len(t, page.Data, 1)
	requireProblem(t, b.do(t, http.MethodGet, "/v1/runs?blocked=bored", ""), http.StatusBadRequest, "invalid_query")
}
