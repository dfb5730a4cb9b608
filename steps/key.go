package steps

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"strconv"
	"strings"
)

// Key is a child idempotency key: what a step sends downstream so that a
// retried call is the same call.
//
// A key is "rk1_" followed by 32 characters of lowercase base32 (a-z, 2-7):
// 36 bytes, safe in an HTTP header, a URL or a file name.
type Key string

// KeyLen is the length of every Key.
const KeyLen = 36

const keyPrefix = "rk1_"

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

// Nth derives the key of the n-th call a step makes with the same key (for
// a step that calls a downstream several times, e.g. once per line item).
// Nth(0) is k itself; otherwise the formula is ChildKey's with domain
// "ratchet/child-key/v1/nth" over field(k) ‖ field(decimal n).
func (k Key) Nth(n int) Key {
	if n == 0 {
		return k
	}
	return derive("ratchet/child-key/v1/nth", string(k), strconv.Itoa(n))
}

func derive(domain string, fields ...string) Key {
	h := sha256.New()
	h.Write([]byte(domain))
	h.Write([]byte{0})
	var n [4]byte
	for _, f := range fields {
		binary.BigEndian.PutUint32(n[:], uint32(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	sum := h.Sum(nil)
	return Key(keyPrefix + strings.ToLower(keyEncoding.EncodeToString(sum[:20])))
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
