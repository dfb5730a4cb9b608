package steps_test

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/steps"
)

// The vectors were computed from the documented formula by an independent
// implementation. If this test fails, the formula changed: in-flight runs
// would send new keys downstream after an upgrade, and their calls would
// happen twice. Do not update the vectors; add a new formula with a new
// prefix instead.
func TestChildKeyGoldenVectors(t *testing.T) {
	t.Parallel()
	for _, v := range []struct {
		tenant, run, phase string
		want               steps.Key
	}{
		{"default", "01JD3M5ZQ6V1YQ2W3E4R5T6Y7U", "charge_created", "rk1_zx34ejctq23fa3zbukvmdgv3xvxapfor"},
		{"acme", "01JD3M5ZQ6V1YQ2W3E4R5T6Y7U", "charge_created", "rk1_svs3oomzrhwxwhk5udppujqxklui54b5"},
		{"", "", "", "rk1_vna6qzno2b6e4grqtzvz7dpcjiv7l52x"},
		{"default", "01JD3M5ZQ6V1YQ2W3E4R5T6Y7U", "ünïcode phase", "rk1_lxso2ig5p6tuw4gwobwm5gdg4xnqhjpr"},
	} {
		require.Equal(t, v.want, steps.ChildKey(v.tenant, v.run, v.phase), "%+v", v)
	}
	k := steps.ChildKey("default", "01JD3M5ZQ6V1YQ2W3E4R5T6Y7U", "charge_created")
	require.Equal(t, k, k.Nth(0))
	require.Equal(t, steps.Key("rk1_plmuhy6fnnxjnl3oxxxob657sbdt5uo7"), k.Nth(1))
}

func TestChildKeysDifferAcrossRunsPhasesAndFieldBoundaries(t *testing.T) {
	t.Parallel()
	keys := []steps.Key{
		steps.ChildKey("t", "run-1", "charge"),
		steps.ChildKey("t", "run-2", "charge"),
		steps.ChildKey("t", "run-1", "refund"),
		steps.ChildKey("u", "run-1", "charge"),
		steps.ChildKey("t", "run-1c", "harge"), // same bytes, other split
		steps.ChildKey("t", "run-1", "charge").Nth(1),
		steps.ChildKey("t", "run-1", "charge").Nth(2),
	}
	seen := map[steps.Key]int{}
	for i, k := range keys {
		j, dup := seen[k]
		require.False(t, dup, "keys %d and %d collide: %s", j, i, k)
		seen[k] = i
	}
	require.Equal(t, steps.ChildKey("t", "run-1", "charge"), steps.ChildKey("t", "run-1", "charge"), "deterministic")
}

func TestChildKeyShape(t *testing.T) {
	t.Parallel()
	shape := regexp.MustCompile(`^rk1_[a-z2-7]{32}$`)
	for _, k := range []steps.Key{
		steps.ChildKey("default", "01JD3M5ZQ6V1YQ2W3E4R5T6Y7U", "charge_created"),
		steps.ChildKey("a\x00b", "\n", "\"quoted\"; and=more"),
		steps.ChildKey("x", "y", "z").Nth(99),
	} {
		require.Len(t, string(k), steps.KeyLen)
		require.Regexp(t, shape, string(k), "header-safe: lowercase base32 after the prefix")
	}
}
