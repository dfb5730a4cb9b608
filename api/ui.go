package api

import (
	"embed"
	"io/fs"
	"net/http"
)

// uiFiles are the operator's page: static files, built by no step, that
// call the API with the bearer token the person enters. They hold no data,
// so they are served without a token.
//
//go:embed ui
var uiFiles embed.FS

// uiHandler serves the page under prefix + "/ui/".
func uiHandler(prefix string) http.Handler {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix(prefix+"/ui/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
