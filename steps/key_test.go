package steps_test

import (
	"encoding/hex"
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

// The second format's vectors, computed the same way.
func TestChildKeyV2GoldenVectors(t *testing.T) {
	t.Parallel()
	const run = "01JD3M5ZQ6V1YQ2W3E4R5T6Y7Z"
	for _, v := range []struct {
		tenant, run, phase string
		want               steps.Key
	}{
		{"default", run, "charge_created", "rk2_01jd3m5zq6v1yq2w3e4r5t6y7z_tdf3rbyr2srlte6iex6v7oi2"},
		{"acme", run, "charge_created", "rk2_01jd3m5zq6v1yq2w3e4r5t6y7z_okr5b4mrgqvp6tzs75djdwh2"},
		{"", "00000000000000000000000000", "", "rk2_00000000000000000000000000_jb6cclplneucidzzqy7jo3kt"},
		{"default", run, "ünïcode phase", "rk2_01jd3m5zq6v1yq2w3e4r5t6y7z_4co24fm4od4ea4r2angaw5ok"},
	} {
		k, err := steps.ChildKeyV2(v.tenant, v.run, v.phase)
		require.NoError(t, err)
		require.Equal(t, v.want, k, "%+v", v)
		require.Len(t, string(k), steps.KeyLenV2)
		got, ok := k.Run()
		require.True(t, ok)
		require.Equal(t, v.run, got, "the key names its run")
	}
	k, err := steps.ChildKeyV2("default", run, "charge_created")
	require.NoError(t, err)
	require.Equal(t, k, k.Nth(0))
	require.Equal(t, steps.Key("rk2_01jd3m5zq6v1yq2w3e4r5t6y7z_iwwdtz733cgwlqgxgq6ulhkr"), k.Nth(1))
	got, ok := k.Nth(7).Run()
	require.True(t, ok)
	require.Equal(t, run, got, "an nth key names the same run")
}

// The third format's vectors, computed the same way (and the request
// digests, which migration 0012 computes in SQL too).
func TestChildKeyV3GoldenVectors(t *testing.T) {
	t.Parallel()
	for _, v := range []struct {
		tenant, key, phase string
		want               steps.Key
		digest             string
	}{
		{"default", "order-42", "charge_created", "rk3_xyzb6apn3d5n5xi4evlbogsdvi_epycv6ttpejtgl55qh4vdski", "be321f01edd8fadedd1c2556171a43aa"},
		{"acme", "order-42", "charge_created", "rk3_tlagctwnbgjyxs4c3ir5msr7zy_ckp3xphwu4anm4zwircwuzgf", "9ac0614ecd09938bcb82da23d64a3fce"},
		{"", "", "", "rk3_uw6dvboshf5l2azq5szes2prqe_nkes77mpqfozdjdyjsd6q4ai", "a5bc3a85d2397abd0330ecb24969f181"},
		{"default", "order-42", "ünïcode phase", "rk3_xyzb6apn3d5n5xi4evlbogsdvi_qi7nffyphsxq2ypfgmre6ht2", "be321f01edd8fadedd1c2556171a43aa"},
		{"default", "order-4", "2charge_created", "rk3_g2p2zxomo6v3qc7zdxmv3p5cam_3gihmr6pf7pplurx2lou7hb6", "369facddcc77abb80bf91dd95dbfa203"},
	} {
		k := steps.ChildKeyV3(v.tenant, v.key, v.phase)
		require.Equal(t, v.want, k, "%+v", v)
		require.Len(t, string(k), steps.KeyLenV2)
		require.Equal(t, v.digest, hex.EncodeToString(steps.RequestDigest(v.tenant, v.key)))
		d, ok := k.Digest()
		require.True(t, ok)
		require.Equal(t, v.digest, hex.EncodeToString(d), "the key carries its request's digest")
		_, ok = k.Run()
		require.False(t, ok, "a key of the third format names no run")
	}
	k := steps.ChildKeyV3("default", "order-42", "charge_created")
	require.Equal(t, k, k.Nth(0))
	require.Equal(t, steps.Key("rk3_xyzb6apn3d5n5xi4evlbogsdvi_6z2c5gdxfrv6v7r3uorcorh3"), k.Nth(1))
	d, ok := k.Nth(7).Digest()
	require.True(t, ok)
	require.Equal(t, steps.RequestDigest("default", "order-42"), d, "an nth key carries the same digest")
	for _, k := range []steps.Key{"", "rk3_xyzb6apn3d5n5xi4evlbogsdvi-epycv6ttpejtgl55qh4vdski", "rk3_xyzb6apn3d5n5xi4evlbogsdv1_epycv6ttpejtgl55qh4vdski",
		"rk3_XYZB6APN3D5N5XI4EVLBOGSDVI_epycv6ttpejtgl55qh4vdski", "rk3_xyzb6apn3d5n5xi4evlbogsdvi_epycv6ttpejtgl55qh4vdsk",
		"rk2_01jd3m5zq6v1yq2w3e4r5t6y7z_tdf3rbyr2srlte6iex6v7oi2"} {
		_, ok := k.Digest()
		require.False(t, ok, "%q carries no digest", k)
	}
}

func TestChildKeyV2WantsARunIDThatIsAULID(t *testing.T) {
	t.Parallel()
	for _, run := range []string{"", "run-1", "01jd3m5zq6v1yq2w3e4r5t6y7z", "01JD3M5ZQ6V1YQ2W3E4R5T6Y7U", "81JD3M5ZQ6V1YQ2W3E4R5T6Y7Z", "01JD3M5ZQ6V1YQ2W3E4R5T6Y7Z0"} {
		_, err := steps.ChildKeyV2("t", run, "charge")
		require.Error(t, err, "%q", run)
	}
	for _, k := range []steps.Key{"", "rk1_zx34ejctq23fa3zbukvmdgv3xvxapfor", "rk2_01jd3m5zq6v1yq2w3e4r5t6y7u_tdf3rbyr2srlte6iex6v7oi2",
		"rk2_01jd3m5zq6v1yq2w3e4r5t6y7z-tdf3rbyr2srlte6iex6v7oi2", "rk2_01jd3m5zq6v1yq2w3e4r5t6y7z_tdf3rbyr2srlte6iex6v7oi"} {
		_, ok := k.Run()
		require.False(t, ok, "%q names no run", k)
	}
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
