package worker_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/engine/enginetest"
	"github.com/ratchet-run/ratchet/recovery"
	"github.com/ratchet-run/ratchet/worker"
)

type shippedArgs struct {
	Order string `json:"order"`
}

func (shippedArgs) Kind() string { return "shop.shipped" }

type shippedWorker struct {
	river.WorkerDefaults[shippedArgs]
	sent chan string
}

func (w *shippedWorker) Work(_ context.Context, job *river.Job[shippedArgs]) error {
	w.sent <- job.Args.Order
	return nil
}

// A process's worker: it resumes due runs (a run created by StartTx, here)
// and works the application's outbox jobs, staged with River().InsertTx in
// a phase's transaction.
func Example() {
	ctx := context.Background()
	db, err := enginetest.NewDatabase(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	var w *worker.Worker
	workflows := engine.NewWorkflows()
	ship, err := engine.Register(workflows, "ship", func(ctx context.Context, order string) (string, error) {
		return engine.Atomic(ctx, "shipped", func(ctx context.Context, tx pgx.Tx) (string, error) {
			_, err := w.River().InsertTx(ctx, tx, shippedArgs{Order: order}, &river.InsertOpts{Queue: "mail"})
			return "shipped " + order, err
		}, nil)
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	mail := &shippedWorker{sent: make(chan string, 1)}
	workers := river.NewWorkers()
	river.AddWorker(workers, mail)
	cfg := &worker.Config{
		Engine:   engine.Config{Workflows: workflows, MaxInline: 16},
		Recovery: recovery.Config{PollInterval: 50 * time.Millisecond},
		Workers:  workers,
		Queues:   map[string]river.QueueConfig{"mail": {MaxWorkers: 2}},
	}
	// Size the process's pool (pool_max_conns) by its settings.
	fmt.Println(cfg.Connections())
	w, err = worker.New(db.Pool, cfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}

	// A run created with the order, in the order's transaction; the
	// worker finds it due and executes it.
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := ship.StartTx(ctx, w.Engine(), tx, "order-1", "order-1", nil)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-mail.sent)

	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	fmt.Println(w.Stop(stopCtx))
	// Output:
	// 52
	// order-1
	// <nil>
}
