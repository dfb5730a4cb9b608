package api

import "net/http/httptest"

// StatusOf exposes the error table to tests.
func StatusOf(err error) int { return problemFor(err).Status }

// ProblemHeaders returns the headers writeProblem sends with err's problem.
func ProblemHeaders(err error) map[string][]string {
	w := httptest.NewRecorder()
	writeProblem(w, problemFor(err))
	return w.Header()
}
