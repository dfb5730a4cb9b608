package api

// StatusOf exposes the error table to tests.
func StatusOf(err error) int { return problemFor(err).Status }
