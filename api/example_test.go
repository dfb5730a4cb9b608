package api_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/ratchet-run/ratchet/api"
	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
)

// The API mounted under /ratchet in an application's own mux: a start, its
// replay, and the graceful shutdown's first step.
func Example() {
	ctx := context.Background()
	db, err := enginetest.NewDatabase(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	workflows := engine.NewWorkflows()
	_, err = engine.Register(workflows, "greet", func(ctx context.Context, in struct{ Name string }) (string, error) {
		return engine.Atomic(ctx, "greeted", func(context.Context, pgx.Tx) (string, error) { return "hello " + in.Name, nil }, nil)
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	// In a service, use a worker's engine (worker.Worker.Engine), so that
	// runs a request does not finish are resumed.
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx) //nolint:errcheck

	h, err := api.New(&api.Config{Engine: client, Tokens: map[string]string{"s3cret": "acme"}, PathPrefix: "/ratchet"})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ratchet/", h)
	srv := h.NewServer(":8080", mux) // what ListenAndServe would serve
	fmt.Println(srv.WriteTimeout)
	app := httptest.NewServer(srv.Handler)
	defer app.Close()

	start := func() {
		req, _ := http.NewRequest(http.MethodPost, app.URL+"/ratchet/v1/workflows/greet/runs", strings.NewReader(`{"Name":"Ada"}`))
		req.Header.Set("Authorization", "Bearer s3cret")
		req.Header.Set("Idempotency-Key", "greet-1")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), strings.HasPrefix(resp.Header.Get("Location"), "/ratchet/v1/runs/"),
			strings.Contains(string(body), `"output":"hello Ada"`))
	}
	start()
	start()

	h.Drain() // on SIGTERM: waiting requests answer 202 at once
	// Output:
	// 1m10s
	// 201  true true
	// 201 true true true
}
