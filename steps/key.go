package steps

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/oklog/ulid/v2"
)

// Key is a child idempotency key: what a step sends downstream so that a
// retried call is the same call.
//
// A key of the first format is "rk1_" followed by 32 characters of
// lowercase base32 (a-z, 2-7): 36 bytes. A key of the second is "rk2_",
// the run's id in lowercase, "_" and 24 characters of lowercase base32:
// 55 bytes. A key of the third is "rk3_", the request's digest in 26
// characters of lowercase base32, "_" and 24 more: 55 bytes too. All are
// safe in an HTTP header, a URL or a file name.
type Key string

// KeyLen is the length of a key of the first format (ChildKey); KeyLenV2
// of the second (ChildKeyV2) and of the third (ChildKeyV3).
const (
	KeyLen   = 36
	KeyLenV2 = 55
)

const (
	keyPrefix   = "rk1_"
	keyPrefixV2 = "rk2_"
	keyPrefixV3 = "rk3_"
)

var keyEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// ChildKey derives the key of the step named phase in the run runID of
// tenant:
//
//	"rk1_" + lower(base32(SHA-256(
//	    "ratchet/child-key/v1" ‖ 0x00 ‖ field(tenant) ‖ field(runID) ‖ field(phase)
//	)[:20]))
//
// where field(s) is len(s) as 4 bytes big-endian followed by the bytes of s.
// The length prefixes keep ("ab", "c") and ("a", "bc") apart. 160 bits make
// an accidental collision negligible across any number of runs.
//
// The formula is frozen: golden vectors in the tests pin it, because a run
// in flight during an upgrade must send the keys it sent before. A new
// formula gets a new prefix.
func ChildKey(tenant, runID, phase string) Key {
	return derive("ratchet/child-key/v1", tenant, runID, phase)
}

// ChildKeyV2 derives the key of the step named phase in the run runID of
// tenant in the second format, which names the run:
//
//	"rk2_" + lower(runID) + "_" + lower(base32(SHA-256(
//	    "ratchet/child-key/v2" ‖ 0x00 ‖ field(tenant) ‖ field(runID) ‖ field(phase)
//	)[:15]))
//
// runID must be a ULID in its canonical form (26 characters of Crockford's
// base32, upper case), as the engine's run ids are; anything else is an
// error. Key.Run reads the run back out of the key, so the run that sent a
// key is found by its id, with no index of every key ever sent. The run id
// makes the key unique across runs; the 120 bits of hash keep the phases of
// one run (and tenants) apart.
//
// Like ChildKey's, the formula is frozen by golden vectors.
func ChildKeyV2(tenant, runID, phase string) (Key, error) {
	if !isULID(runID) {
		return "", fmt.Errorf("steps: run id %q is not a canonical ULID", runID)
	}
	return Key(keyPrefixV2 + strings.ToLower(runID) + "_" + hash("ratchet/child-key/v2", 15, tenant, runID, phase)), nil
}

// ChildKeyV3 derives the key of the step named phase in the run that the
// request idempotencyKey of tenant started, in the third format, which
// names the request rather than the run:
//
//	"rk3_" + lower(base32(RequestDigest(tenant, idempotencyKey))) + "_" +
//	lower(base32(SHA-256(
//	    "ratchet/child-key/v3" ‖ 0x00 ‖ field(tenant) ‖ field(idempotencyKey) ‖ field(phase)
//	)[:15]))
//
// A run whose creation is lost (a failover to a standby the commit had not
// reached) and that the client's retry creates again sends the same keys
// as the lost one did: the downstream sees one call. Keys of the first two
// formats derive from the run's id, which the new run does not share.
// Key.Digest reads the request's digest back out of the key, so that the
// run is found by it (an index of one entry per run, not per key).
//
// Like the others, the formula is frozen by golden vectors.
func ChildKeyV3(tenant, idempotencyKey, phase string) Key {
	return Key(keyPrefixV3 + strings.ToLower(keyEncoding.EncodeToString(RequestDigest(tenant, idempotencyKey))) + "_" +
		hash("ratchet/child-key/v3", 15, tenant, idempotencyKey, phase))
}

// DigestLen is the length of RequestDigest's digests.
const DigestLen = 16

// RequestDigest identifies a request, its tenant and idempotency key, in
// 16 bytes: SHA-256("ratchet/request/v3" ‖ 0x00 ‖ field(tenant) ‖
// field(idempotencyKey))[:16]. Migration 0012 computes the same in SQL
// (ratchet.request_digest), over which runs' idempotency keys are unique
// (migration 0013): a run is found by the digest a key carries.
func RequestDigest(tenant, idempotencyKey string) []byte {
	return sum("ratchet/request/v3", tenant, idempotencyKey)[:DigestLen]
}

// Digest returns the request digest a key of the third format (ChildKeyV3)
// carries, and false for any other string.
func (k Key) Digest() ([]byte, bool) {
	s := string(k)
	if len(s) != KeyLenV2 || !strings.HasPrefix(s, keyPrefixV3) || s[30] != '_' {
		return nil, false
	}
	d, err := keyEncoding.DecodeString(strings.ToUpper(s[4:30]))
	if err != nil || len(d) != DigestLen || strings.ToLower(keyEncoding.EncodeToString(d)) != s[4:30] {
		return nil, false
	}
	return d, true
}

// Run returns the id of the run a key of the second format (ChildKeyV2)
// names, and false for any other string.
func (k Key) Run() (string, bool) {
	s := string(k)
	if len(s) != KeyLenV2 || !strings.HasPrefix(s, keyPrefixV2) || s[30] != '_' {
		return "", false
	}
	id := strings.ToUpper(s[4:30])
	return id, isULID(id)
}

// Nth derives the key of the n-th call a step makes with the same key (for
// a step that calls a downstream several times, e.g. once per line item).
// Nth(0) is k itself. Otherwise, for a key of the first format, the formula
// is ChildKey's with domain "ratchet/child-key/v1/nth" over field(k) ‖
// field(decimal n); for one of the second, k's first 31 characters (the
// prefix, the run, "_") followed by the hash of ChildKeyV2 with domain
// "ratchet/child-key/v2/nth" over field(k) ‖ field(decimal n), so that it
// names the same run; for one of the third, likewise with domain
// "ratchet/child-key/v3/nth", so that it carries the same digest.
func (k Key) Nth(n int) Key {
	if n == 0 {
		return k
	}
	if _, ok := k.Run(); ok {
		return k[:31] + Key(hash("ratchet/child-key/v2/nth", 15, string(k), strconv.Itoa(n)))
	}
	if _, ok := k.Digest(); ok {
		return k[:31] + Key(hash("ratchet/child-key/v3/nth", 15, string(k), strconv.Itoa(n)))
	}
	return derive("ratchet/child-key/v1/nth", string(k), strconv.Itoa(n))
}

// isULID reports whether s is a ULID in canonical form: as the engine
// writes run ids, 26 characters of Crockford's base32 in upper case.
func isULID(s string) bool {
	id, err := ulid.ParseStrict(s)
	return err == nil && id.String() == s
}

func derive(domain string, fields ...string) Key {
	return Key(keyPrefix + hash(domain, 20, fields...))
}

// hash is lower(base32(SHA-256(domain ‖ 0x00 ‖ field(f)…)[:n])), unpadded.
func hash(domain string, n int, fields ...string) string {
	return strings.ToLower(keyEncoding.EncodeToString(sum(domain, fields...)[:n]))
}

// sum is SHA-256(domain ‖ 0x00 ‖ field(f)…).
func sum(domain string, fields ...string) []byte {
	h := sha256.New()
	h.Write([]byte(domain))
	h.Write([]byte{0})
	var size [4]byte
	for _, f := range fields {
		binary.BigEndian.PutUint32(size[:], uint32(len(f)))
		h.Write(size[:])
		h.Write([]byte(f))
	}
	return h.Sum(nil)
}

type keyContextKey struct{}

// WithKey returns a context carrying key, for Transport to send.
func WithKey(ctx context.Context, key Key) context.Context {
	return context.WithValue(ctx, keyContextKey{}, key)
}

// KeyFrom returns the key carried by ctx, if any.
func KeyFrom(ctx context.Context) (Key, bool) {
	k, ok := ctx.Value(keyContextKey{}).(Key)
	return k, ok
}
