package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"

	"github.com/ratchet-run/ratchet/internal/telemetry"
	"github.com/ratchet-run/ratchet/migrations"
)

type serveCmd struct {
	dbFlags
	appFlags
	Addr   string `name:"addr" env:"RATCHET_ADDR" default:"127.0.0.1:8080" help:"Address the API listens on (env RATCHET_ADDR)."`
	Worker bool   `name:"worker" default:"true" negatable:"" help:"Also work jobs: resume crashed runs, deliver receipts (--no-worker for an API-only process)."`
}

func (c *serveCmd) Run(e *env) error {
	a, closeApp, err := openApp(e, c.dbFlags, c.appFlags, c.Worker)
	if err != nil {
		return err
	}
	defer closeApp()
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("API cannot listen on %s: %s", c.Addr, reason(err))
	}
	if err := a.worker.Start(e.ctx); err != nil {
		ln.Close()
		return err
	}
	srv := a.handler.NewServer(c.Addr, nil)
	fmt.Fprintf(e.stdout, "ratchet API listening on http://%s (worker: %t)\n", ln.Addr(), c.Worker)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		_ = stopApp(a, nil)
		return err
	case <-e.ctx.Done():
	}
	fmt.Fprintln(e.stdout, "shutting down")
	if err := stopApp(a, srv); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type workerCmd struct {
	dbFlags
	appFlags
}

func (c *workerCmd) Run(e *env) error {
	f := c.appFlags
	f.MaxInline = 0 // no API: nothing executes inline
	a, closeApp, err := openApp(e, c.dbFlags, f, true)
	if err != nil {
		return err
	}
	defer closeApp()
	if err := a.worker.Start(e.ctx); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "ratchet worker running")
	<-e.ctx.Done()
	fmt.Fprintln(e.stdout, "shutting down")
	return stopApp(a, nil)
}

// newLogger logs JSON at level to w, with the trace of each record.
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(telemetry.LogHandler(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})))
}

// openApp connects to a migrated database, sets the example tables and
// telemetry up, and wires the service. closeApp releases what it opened.
func openApp(e *env, db dbFlags, f appFlags, work bool) (a *app, closeApp func(), err error) {
	db.conns = workerConfig(f, work).Connections()
	logger := newLogger(e.stderr, slog.LevelInfo)
	db.log = logger
	pool, err := db.connect(e.ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := migrations.Check(e.ctx, pool); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("%v: run `ratchet migrate` first", err)
	}
	if err := setUp(e.ctx, pool, nil); err != nil {
		pool.Close()
		return nil, nil, err
	}
	shutdown, err := telemetry.Setup(e.ctx, nil)
	if err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("telemetry: %w", err)
	}
	closeApp = func() {
		_ = shutdown(context.WithoutCancel(e.ctx)) // best effort at exit
		pool.Close()
	}
	if have := int(pool.Config().MaxConns); have < db.conns {
		logger.Warn("the database pool is smaller than these settings need: executions will wait for connections",
			slog.Int("pool_max_conns", have), slog.Int("needed", db.conns))
	}
	if a, err = newApp(pool, f, work, logger); err != nil {
		closeApp()
		return nil, nil, err
	}
	return a, closeApp, nil
}
