package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An unfinished run says when no live process serves its workflow
// version: it waits for one.
func TestARunSaysWhenNoLiveProcessServesItsVersion(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	nap := decode[struct {
		ID string `json:"id"`
	}](t, b.start(t, "nap", "n1", `{"value":"a"}`))
	get := func() string {
		r := b.do(t, http.MethodGet, "/v1/runs/"+nap.ID, "")
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		return decode[struct {
			Unserved string `json:"unserved"`
		}](t, r).Unserved
	}
	require.Equal(t, "no live process runs nap@1", get())
	require.NoError(t, b.engine.Announce(context.Background(), time.Minute))
	require.Empty(t, get())
}
