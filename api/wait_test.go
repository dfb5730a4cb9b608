package api_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A sleeping run is answered 202 at once, and its resource says what it
// waits for and until when.
func TestASleepingRunShowsWhatItWaitsFor(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	type waiting struct {
		ID         string `json:"id"`
		Status     string `json:"status"`
		WaitingFor *struct {
			Kind  string    `json:"kind"`
			Phase string    `json:"phase"`
			Until time.Time `json:"until"`
		} `json:"waiting_for"`
	}
	began := time.Now()
	r := b.start(t, "nap", "k", `{"value":"z"}`)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r)
	run := decode[waiting](t, r)
	require.Equal(t, "waiting", run.Status)
	require.NotNil(t, run.WaitingFor)
	require.Equal(t, "sleep", run.WaitingFor.Kind)
	require.Equal(t, "napped", run.WaitingFor.Phase)
	require.WithinDuration(t, began.Add(time.Hour), run.WaitingFor.Until, time.Minute)

	got := decode[waiting](t, b.do(t, http.MethodGet, r.header.Get("Location"), ""))
	require.Equal(t, run, got)

	// Cancelled, it is finished: nothing is waited for any more.
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/runs/"+run.ID+"/cancel", "").status)
	require.Nil(t, decode[waiting](t, b.do(t, http.MethodGet, r.header.Get("Location"), "")).WaitingFor)
}
