package api

import (
	"net/http"
	"time"
)

// NewServer returns an http.Server with the timeouts a public service
// needs: headers within 5s, a body within 30s, a response within h's
// MaxWait plus 10s (so an inline wait is never cut), idle connections
// closed after 2 minutes, headers at most 64 KiB. It serves root, the
// application's handler that mounts h (see Config.PathPrefix), or h
// itself when root is nil.
func (h *Handler) NewServer(addr string, root http.Handler) *http.Server {
	if root == nil {
		root = h
	}
	return &http.Server{
		Addr:              addr,
		Handler:           root,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      h.cfg.MaxWait + 10*time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}
