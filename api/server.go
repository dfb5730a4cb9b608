package api

import (
	"net/http"
	"time"
)

// NewServer returns an http.Server for h with the timeouts a public
// service needs: headers within 5s, a body within 30s, a response within
// maxWait plus 10s (so an inline wait is never cut), idle connections
// closed after 2 minutes, headers at most 64 KiB.
func NewServer(addr string, h http.Handler, maxWait time.Duration) *http.Server {
	if maxWait <= 0 {
		maxWait = DefaultMaxWait
	}
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      maxWait + 10*time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}
