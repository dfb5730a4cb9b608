package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/testdb"
)

// inFlight seeds a payment run in flight, as a crashed process leaves one,
// with the given version and journal (phase names, each with output "x").
func inFlight(t *testing.T, url, id string, version int, journal ...string) {
	t.Helper()
	pool := testdb.Connect(t, url, nil)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO ratchet.runs (id, tenant, idempotency_key, workflow, workflow_version, input, fingerprint, status, lease_token, attempt)
		VALUES ($1::text, 'default', $1::text, 'payment', $2, '{"amount": 100, "currency": "usd", "customer": "cus_1", "email": "a@example.com"}', sha256(convert_to($1::text, 'UTF8')), 'pending', 1, 1)`,
		id, version)
	require.NoError(t, err)
	for seq, name := range journal {
		_, err := pool.Exec(ctx, `INSERT INTO ratchet.phases (run_id, seq, name, kind, output, started_at, finished_at)
			VALUES ($1, $2, $3, 'atomic', '"x"', now(), now())`, id, seq, name)
		require.NoError(t, err)
	}
}

func checkDeploy(t *testing.T, url string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Main(context.Background(), append([]string{"check-deploy", "--database-url", url}, args...), &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestCheckDeployPassesWhatThisBuildCanFinish(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	inFlight(t, url, "01KAAAAAAAAAAAAAAAAAAAAAA1", 1, "payment_created")
	out, errOut, code := checkDeploy(t, url)
	require.Equal(t, 0, code, "%s%s", out, errOut)
	require.Contains(t, out, "checked 1 runs in flight")
	require.Contains(t, out, "1 compatible, 0 incompatible, 0 unregistered")
	require.Contains(t, out, "payment@1")
}

func TestCheckDeployFailsTheDeployAndSaysWhy(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	inFlight(t, url, "01KAAAAAAAAAAAAAAAAAAAAAA1", 1, "payment_created")
	inFlight(t, url, "01KAAAAAAAAAAAAAAAAAAAAAA2", 1, "payment_created", "refund_created") // not this build's phase
	inFlight(t, url, "01KAAAAAAAAAAAAAAAAAAAAAA3", 7)                                      // a version it does not register

	out, errOut, code := checkDeploy(t, url)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "2 of 3 runs in flight cannot be finished by this build")
	require.Contains(t, out, "01KAAAAAAAAAAAAAAAAAAAAAA2  payment@1")
	require.Contains(t, out, `1: refund_created ≠ charge_created`)
	require.Contains(t, out, "payment@7")

	out, _, code = checkDeploy(t, url, "--json")
	require.Equal(t, 1, code)
	var report engine.DeployReport
	require.NoError(t, json.Unmarshal([]byte(out), &report))
	require.Equal(t, 3, report.Checked)
	require.Equal(t, 1, report.Incompatible)
	require.Equal(t, 1, report.Unregistered)
	require.Equal(t, map[string]int{"payment@1": 2, "payment@7": 1}, report.InFlight)
	require.Len(t, report.Problems, 2)
	require.Equal(t, engine.VerdictIncompatible, report.Problems[0].Verdict)
	require.Equal(t, "charge_created", report.Problems[0].Called)
	require.Equal(t, engine.VerdictUnregistered, report.Problems[1].Verdict)
}
