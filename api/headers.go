package api

import (
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// parseIdempotencyKey reads the Idempotency-Key header: exactly one value,
// either a bare token or a structured-field string ("..." with \" and \\
// escapes), of 1..255 printable ASCII characters.
func parseIdempotencyKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", errMissingKey
	case 1:
	default:
		return "", fmt.Errorf("%d Idempotency-Key headers; send one", len(values))
	}
	v := strings.TrimSpace(values[0])
	if v == "" {
		return "", errMissingKey
	}
	return parseHeaderKey(v)
}

// parseHeaderKey reads a key header's value: a bare token or a
// structured-field string, of 1..255 printable ASCII characters.
func parseHeaderKey(v string) (string, error) {
	var key string
	if v[0] == '"' {
		var b strings.Builder
		closed := false
		for i := 1; i < len(v); i++ {
			c := v[i]
			switch {
			case c == '\\' && i+1 < len(v) && (v[i+1] == '"' || v[i+1] == '\\'):
				b.WriteByte(v[i+1])
				i++
			case c == '\\':
				return "", fmt.Errorf("bad escape in structured-string key")
			case c == '"':
				if i != len(v)-1 {
					return "", fmt.Errorf("data after the closing quote of the key")
				}
				closed = true
			case c < 0x20 || c > 0x7e:
				return "", fmt.Errorf("key holds a byte outside printable ASCII")
			default:
				b.WriteByte(c)
			}
		}
		if !closed {
			return "", fmt.Errorf("unterminated structured-string key")
		}
		key = b.String()
	} else {
		for i := 0; i < len(v); i++ {
			if v[i] <= 0x20 || v[i] > 0x7e {
				return "", fmt.Errorf("key holds a space or a byte outside printable ASCII; quote it as a structured string to include spaces")
			}
		}
		key = v
	}
	if len(key) == 0 || len(key) > 255 {
		return "", fmt.Errorf("key is %d characters; want 1..255", len(key))
	}
	return key, nil
}

var errMissingKey = fmt.Errorf("the Idempotency-Key header is required")

// concurrencyHeaders reads the optional Ratchet-Concurrency-Key (a key,
// written as Idempotency-Key is) and Ratchet-Concurrency-Limit (a whole
// number, 1 or more) of a start: the run's own concurrency key and limit
// in place of its workflow's (engine.StartParams).
func concurrencyHeaders(h http.Header) (key string, limit int, err error) {
	switch values := h.Values("Ratchet-Concurrency-Key"); len(values) {
	case 0:
	case 1:
		v := strings.TrimSpace(values[0])
		if v == "" {
			return "", 0, fmt.Errorf("Ratchet-Concurrency-Key is empty")
		}
		if key, err = parseHeaderKey(v); err != nil {
			return "", 0, fmt.Errorf("Ratchet-Concurrency-Key: %w", err)
		}
	default:
		return "", 0, fmt.Errorf("%d Ratchet-Concurrency-Key headers; send one", len(values))
	}
	switch values := h.Values("Ratchet-Concurrency-Limit"); len(values) {
	case 0:
	case 1:
		n, err := strconv.ParseInt(strings.TrimSpace(values[0]), 10, 32)
		if err != nil || n < 1 {
			return "", 0, fmt.Errorf("Ratchet-Concurrency-Limit %q: want a whole number, 1 or more", values[0])
		}
		limit = int(n)
	default:
		return "", 0, fmt.Errorf("%d Ratchet-Concurrency-Limit headers; send one", len(values))
	}
	return key, limit, nil
}

// queueHeaders reads the optional Ratchet-Queue (a queue's name) and
// Ratchet-Priority (a whole number, higher first) of a start: the queue the
// run waits in, in place of its workflow's, and its place there
// (engine.StartParams). A queue the server does not declare is the
// engine's to refuse.
func queueHeaders(h http.Header) (queue string, priority int, err error) {
	switch values := h.Values("Ratchet-Queue"); len(values) {
	case 0:
	case 1:
		if queue = strings.TrimSpace(values[0]); !validQueueName(queue) {
			return "", 0, fmt.Errorf("Ratchet-Queue %q: want 1..255 letters, digits, '.', '-' or '_'", values[0])
		}
	default:
		return "", 0, fmt.Errorf("%d Ratchet-Queue headers; send one", len(values))
	}
	switch values := h.Values("Ratchet-Priority"); len(values) {
	case 0:
	case 1:
		n, err := strconv.ParseInt(strings.TrimSpace(values[0]), 10, 32)
		if err != nil {
			return "", 0, fmt.Errorf("Ratchet-Priority %q: want a whole number (higher starts first)", values[0])
		}
		priority = int(n)
	default:
		return "", 0, fmt.Errorf("%d Ratchet-Priority headers; send one", len(values))
	}
	return queue, priority, nil
}

func validQueueName(s string) bool {
	if len(s) == 0 || len(s) > 255 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// preferredWait reads "Prefer: wait=N" (RFC 7240) in seconds. ok is false
// when the header asks for no wait.
func preferredWait(values []string) (wait time.Duration, ok bool) {
	for _, v := range values {
		for _, pref := range strings.Split(v, ",") {
			name, val, _ := strings.Cut(strings.TrimSpace(pref), "=")
			if !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			val, _, _ = strings.Cut(val, ";")
			n, err := strconv.ParseUint(strings.Trim(strings.TrimSpace(val), `"`), 10, 32)
			if err != nil {
				continue
			}
			return time.Duration(n) * time.Second, true
		}
	}
	return 0, false
}

// isJSON reports whether a Content-Type is JSON (application/json or any
// +json type).
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}
