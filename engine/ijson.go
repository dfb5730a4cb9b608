package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"
)

// checkIJSON refuses JSON that decoders may read differently, so that the
// bytes fingerprinted, the value stored and the value a gateway, firewall
// or audit log reads are one and the same (I-JSON, RFC 7493):
//
//   - bytes that are not UTF-8: Go's decoder would replace them with U+FFFD,
//     so two different requests would get one fingerprint;
//   - an escaped surrogate that is not half of a pair ("\ud800"): the same;
//   - an object with a member name twice: decoders disagree on which one
//     counts (Go's takes the last).
func checkIJSON(raw []byte) error {
	if !utf8.Valid(raw) {
		return errors.New("the document is not valid UTF-8")
	}
	if err := checkSurrogates(raw); err != nil {
		return err
	}
	return checkDuplicateNames(raw)
}

// checkSurrogates finds \uXXXX escapes of UTF-16 surrogates inside strings
// that are not a high surrogate followed at once by a low one.
func checkSurrogates(raw []byte) error {
	inString := false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case c == '"':
			inString = !inString
		case inString && c == '\\' && i+1 < len(raw):
			if raw[i+1] != 'u' {
				i++ // a one-character escape, \" and \\ included
				continue
			}
			r, ok := hexRune(raw, i+2)
			if !ok {
				continue // malformed: the decoder reports it
			}
			switch {
			case r >= 0xD800 && r <= 0xDBFF:
				low, ok := uint16(0), false
				if i+7 < len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' {
					var r2 rune
					r2, ok = hexRune(raw, i+8)
					low = uint16(r2)
					ok = ok && low >= 0xDC00 && low <= 0xDFFF
				}
				if !ok {
					return fmt.Errorf("an unpaired UTF-16 surrogate escape at byte %d", i)
				}
				i += 11
			case r >= 0xDC00 && r <= 0xDFFF:
				return fmt.Errorf("an unpaired UTF-16 surrogate escape at byte %d", i)
			default:
				i += 5
			}
		}
	}
	return nil
}

// hexRune reads four hex digits at raw[at:].
func hexRune(raw []byte, at int) (rune, bool) {
	if at+4 > len(raw) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(raw[at:at+4]), 16, 16)
	return rune(v), err == nil
}

// checkDuplicateNames walks the document's tokens and refuses an object
// that names a member twice.
func checkDuplicateNames(raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	// One entry per open container: the names seen, or nil for an array.
	var open []map[string]bool
	expectName := false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return nil // malformed: the decoder that follows reports it
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				open = append(open, map[string]bool{})
				expectName = true
				continue
			case '[':
				open = append(open, nil)
			case '}', ']':
				open = open[:len(open)-1]
			}
		case string:
			if expectName {
				names := open[len(open)-1]
				if names[t] {
					return fmt.Errorf("member %q appears twice in one object", t)
				}
				names[t] = true
				expectName = false
				continue
			}
		}
		// After a value inside an object comes a name again.
		expectName = len(open) > 0 && open[len(open)-1] != nil
	}
}
