package api_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FuzzStartRun throws arbitrary keys, content types, Prefer headers and
// bodies at the start endpoint: no input may cause a 5xx or a panic. The
// seeds run with the test suite; to search further:
//
//	go test -run '^$' -fuzz FuzzStartRun -fuzztime 60s ./api/
func FuzzStartRun(f *testing.F) {
	seeds := []struct{ workflow, key, contentType, prefer, body string }{
		{"echo", "k1", "application/json", "", `{"value":"a"}`},
		{"echo", "k1", "application/json", "", `{"value":"b"}`},
		{"echo", `"quoted key"`, "application/json; charset=utf-8", "wait=1", `{"value":"c"}`},
		{"echo", "", "application/json", "", `{}`},
		{"echo", "k2", "text/plain", "", `{}`},
		{"echo", "k3", "application/json", "wait=99999999999", `{"value":`},
		{"echo", "k4", "application/json", "", `{"value":"nul\u0000"}`},
		{"echo", "k5", "application/json", "", `[1e1000000]`},
		{"echo", "k6", "application/json", "", `{"value":"\ud800"}`},
		{"echo", "k7", "application/merge-patch+json", "wait=0", `null`},
		{"echo", "\x00", "application/json", "", `{}`},
		{"slow", "k8", "application/json", "wait=0", `{"value":"s"}`},
		{"nope", "k9", "application/json", "", `{}`},
		{"pay", "k10", "application/json", "", `{"customer":"cus_declined","amount":1}`},
	}
	for _, s := range seeds {
		f.Add(s.workflow, s.key, s.contentType, s.prefer, s.body)
	}
	b := setup(f, nil)
	close(b.release) // slow runs finish at once
	f.Fuzz(func(t *testing.T, workflow, key, contentType, prefer, body string) {
		req := httptest.NewRequest(http.MethodPost, "/v1/workflows/x/runs", bytes.NewReader([]byte(body)))
		req.SetPathValue("workflow", workflow)
		req.URL.Path = "/v1/workflows/" + workflow + "/runs"
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", contentType)
		if prefer != "" {
			req.Header.Set("Prefer", prefer)
		}
		rec := httptest.NewRecorder()
		b.handler.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("status %d for key %q, type %q, prefer %q, body %q: %s", rec.Code, key, contentType, prefer, body, rec.Body)
		}
	})
}
