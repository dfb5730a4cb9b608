package pgboot

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// What Patroni 3.0.2's GET /cluster answers, read as it reports them:
// the switchover's precondition and, when it does not hold, why.
func TestCanTakeLeadReadsPatronisClusterView(t *testing.T) {
	t.Parallel()
	view := func(body string) clusterView {
		t.Helper()
		var v clusterView
		require.NoError(t, json.Unmarshal([]byte(body), &v))
		return v
	}
	recorded := view(`{"members": [
		{"name": "n1", "role": "leader", "state": "running", "api_url": "http://127.0.0.1:1/patroni", "timeline": 1},
		{"name": "n2", "role": "sync_standby", "state": "running", "api_url": "http://127.0.0.1:2/patroni", "timeline": 1, "lag": 0}]}`)
	require.Empty(t, recorded.canTakeLead("n1", "n2", true))
	require.Empty(t, recorded.canTakeLead("n1", "n2", false), "a sync standby can take the lead asynchronously too")
	require.Equal(t, "n2 is not the leader", recorded.canTakeLead("n2", "n1", true))
	require.Equal(t, "n1 leader running timeline 1, n2 sync_standby running timeline 1 lag 0", recorded.String())

	notYet := view(`{"members": [
		{"name": "n1", "role": "leader", "state": "running", "timeline": 2},
		{"name": "n2", "role": "replica", "state": "running", "timeline": 2, "lag": 0}]}`)
	require.Equal(t, "n2 is replica, not sync_standby", notYet.canTakeLead("n1", "n2", true))
	require.Empty(t, notYet.canTakeLead("n1", "n2", false))

	rejoining := view(`{"members": [
		{"name": "n1", "role": "replica", "state": "stopping", "lag": "unknown"},
		{"name": "n2", "role": "leader", "state": "running", "timeline": 2}]}`)
	require.Equal(t, "n1 is stopping", rejoining.canTakeLead("n2", "n1", false))
	require.Equal(t, `n1 replica stopping lag "unknown", n2 leader running timeline 2`, rejoining.String())

	unknownLag := view(`{"members": [
		{"name": "n1", "role": "leader", "state": "running"},
		{"name": "n2", "role": "replica", "state": "streaming", "lag": "unknown"}]}`)
	require.Equal(t, "n2's lag is unknown", unknownLag.canTakeLead("n1", "n2", false))

	paused := view(`{"members": [], "pause": true}`)
	require.Equal(t, "the cluster is paused", paused.canTakeLead("n1", "n2", false))
	require.Equal(t, "n1 is not the leader", view(`{"members": []}`).canTakeLead("n1", "n2", false))
}
