package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// cli is the command line: one field per subcommand.
type cli struct {
	Dev     devCmd     `cmd:"" help:"Zero-configuration demo: find or start Postgres, migrate, run the API, a worker, the payment example and the fakes in one process."`
	Serve   serveCmd   `cmd:"" help:"Run the API and a worker (--no-worker: the API only)."`
	Worker  workerCmd  `cmd:"" help:"Run a worker only: resume crashed and retried runs, prune, deliver receipts."`
	Migrate migrateCmd `cmd:"" help:"Apply Ratchet's and River's migrations to the database."`
	Fakes   fakesCmd   `cmd:"" help:"Run the fake payment gateway and mail service as their own process."`
	Bench   benchCmd   `cmd:"" help:"Benchmarks in a scratch database: engines (the default: a plain engine against a worker's), history, commits, retention, scale, concurrency."`
	Chaos   chaosCmd   `cmd:"" help:"Break real servers on this machine and count what survived: failover (a standby promoted mid-load)."`

	Runs        runsCmd        `cmd:"" help:"Look at runs and act on them, over the API (--server, RATCHET_TOKEN): list, show, why, cancel, resume, signal."`
	Schedules   schedulesCmd   `cmd:"" help:"Look at schedules and act on them, over the API: list, show, put, pause, resume, trigger, delete."`
	CheckDeploy checkDeployCmd `cmd:"" name:"check-deploy" help:"The deploy gate: replay every run in flight against this build's workflows, writing nothing; exit 1 if any cannot be finished by it."`
}

// env is what every subcommand's Run receives.
type env struct {
	ctx    context.Context
	stdout io.Writer
	stderr io.Writer
}

// dbFlags are the connection options shared by subcommands.
type dbFlags struct {
	DatabaseURL string `name:"database-url" env:"DATABASE_URL" default:"${default_database_url}" help:"Postgres connection string (env DATABASE_URL); pool_max_conns in it overrides the pool size serve and worker compute."`

	// conns sizes the pool connect opens; zero keeps pgxpool's default.
	conns int
	// log, when set, hears of each connection dropped for being read-only.
	log *slog.Logger
}

// Main parses args, runs the chosen subcommand and returns the exit code.
// Errors are printed as one line on stderr.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var root cli
	exit := -1
	parser, err := kong.New(&root,
		kong.Name("ratchet"),
		kong.Description("Ratchet: durable workflows for Go on Postgres."),
		kong.Writers(stdout, stderr),
		kong.Exit(func(code int) { exit = code }),
		kong.UsageOnError(),
		kong.Vars{"default_database_url": defaultDatabaseURL},
	)
	if err != nil {
		fmt.Fprintln(stderr, "ratchet:", err)
		return 2
	}
	kctx, err := parser.Parse(args)
	if exit >= 0 { // --help and friends
		return exit
	}
	if err != nil {
		fmt.Fprintln(stderr, "ratchet:", err)
		return 2
	}
	if err := kctx.Run(&env{ctx: ctx, stdout: stdout, stderr: stderr}); err != nil {
		fmt.Fprintln(stderr, "ratchet:", err)
		return 1
	}
	return 0
}

// connect opens a pool and checks that the server answers, turning the
// usual failures into one line a person can act on.
func (f *dbFlags) connect(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(f.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("bad database URL: %s", strings.TrimPrefix(err.Error(), "cannot parse `"+f.DatabaseURL+"`: "))
	}
	if f.conns > 0 && !strings.Contains(f.DatabaseURL, "pool_max_conns") {
		cfg.MaxConns = int32(f.conns) // sized from the service's settings, unless the URL says otherwise
	}
	dropReadOnly(cfg, f.log)
	where := f.where()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to Postgres at %s: %w", where, err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach Postgres at %s: %s (start it, or set DATABASE_URL)", where, reason(err))
	}
	return pool, nil
}

// dropReadOnly makes a connection close when its server refuses a write
// as read-only (SQLSTATE 25006): it reached a standby — the old primary,
// demoted, or the one a proxy or a DNS name still points at during a
// failover. The pool then discards it, and the next connection is made
// afresh, finding the primary (a multi-host URL with
// target_session_attrs=read-write, or the HA manager's endpoint), instead
// of every statement that lands on it failing until a restart. The
// statement itself fails: a run retries it, a client is answered 503.
// Each drop is logged to log, when not nil (chaos failover counts them).
func dropReadOnly(cfg *pgxpool.Config, log *slog.Logger) {
	next := cfg.ConnConfig.OnPgError
	cfg.ConnConfig.OnPgError = func(conn *pgconn.PgConn, pgErr *pgconn.PgError) bool {
		if pgErr.Code == pgerrcode.ReadOnlySQLTransaction {
			if log != nil {
				log.Warn(readOnlyDropped, slog.String("host", conn.Conn().RemoteAddr().String()))
			}
			return false
		}
		return next == nil || next(conn, pgErr)
	}
}

// readOnlyDropped is the message of dropReadOnly's log record.
const readOnlyDropped = "a server refused a write as read-only (25006): connection dropped, the next one looks for the primary"

// where names the database of the URL without its credentials.
func (f *dbFlags) where() string {
	cfg, err := pgxpool.ParseConfig(f.DatabaseURL)
	if err != nil {
		return "the database"
	}
	c := cfg.ConnConfig
	return fmt.Sprintf("%s:%d/%s", c.Host, c.Port, c.Database)
}

// reason shortens a connection error to its cause.
func reason(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return opErr.Err.Error()
	}
	return err.Error()
}
