package api_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratchet-run/ratchet/api"
	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/worker"
)

// Serving the API from a process that also resumes crashed runs. Compiled,
// not run: it serves until stopped.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	workflows := engine.NewWorkflows()
	// ... engine.Register(workflows, ...) ...
	w, err := worker.New(pool, &worker.Config{Engine: engine.Config{Workflows: workflows}})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer w.Stop(context.Background()) //nolint:errcheck

	h, err := api.New(&api.Config{Engine: w.Engine(), Tokens: map[string]string{os.Getenv("API_TOKEN"): "acme"}})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(h.NewServer(":8080", nil).ListenAndServe())
}
