package engine

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// canonicalJSON re-encodes a JSON document so that equal documents are equal
// bytes: object keys sorted, insignificant whitespace removed, numbers kept
// exactly as written (1.0 and 1 stay distinct: the engine does not guess
// what a number means to the workflow). Documents that decoders may read
// differently are refused first (checkIJSON).
func canonicalJSON(raw []byte) ([]byte, error) {
	if err := checkIJSON(raw); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("unexpected data after the JSON value")
	}
	if hasNUL(v) {
		return nil, errors.New("a string holds U+0000, which Postgres cannot store")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // maps encode with sorted keys
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// hasNUL reports whether a decoded JSON value holds U+0000 in a string or
// an object key.
func hasNUL(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.ContainsRune(v, 0)
	case []any:
		for _, e := range v {
			if hasNUL(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range v {
			if strings.ContainsRune(k, 0) || hasNUL(e) {
				return true
			}
		}
	}
	return false
}

// fingerprint identifies a request: SHA-256 over the workflow name, a zero
// byte, and the canonical input.
func fingerprint(workflow string, canonicalInput []byte) []byte {
	h := sha256.New()
	h.Write([]byte(workflow))
	h.Write([]byte{0})
	h.Write(canonicalInput)
	return h.Sum(nil)
}

// checkKey validates an idempotency key: 1..255 characters, none of them a
// control character, in valid UTF-8.
func checkKey(key string) error {
	n := 0
	for i, r := range key {
		if r == 0xFFFD && !validRuneAt(key, i) {
			return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
		}
		if r < 0x20 || r == 0x7F {
			return fmt.Errorf("%w: control character at byte %d", ErrInvalidKey, i)
		}
		n++
	}
	switch {
	case n == 0:
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case n > 255:
		return fmt.Errorf("%w: %d characters, more than 255", ErrInvalidKey, n)
	}
	return nil
}

// validRuneAt distinguishes an encoded U+FFFD from an invalid byte.
func validRuneAt(s string, i int) bool {
	return len(s) >= i+3 && s[i:i+3] == "\uFFFD"
}
