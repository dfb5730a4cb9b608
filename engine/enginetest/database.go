package enginetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oklog/ulid/v2"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/ratchet-run/ratchet/migrations"
)

// DefaultURL is used when DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// templateLockKey serialises template builds across test binaries.
const templateLockKey int64 = 0x7274746d706c0001

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// AdminURL returns the connection string of the server the kit creates
// databases on: DATABASE_URL, else DefaultURL.
func AdminURL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Options adjust a Database. A nil *Options is valid.
type Options struct {
	// MaxConns sizes the database's pool. Defaults to pgxpool's default
	// (the greater of 4 and the number of CPUs).
	MaxConns int32
}

// Database is a migrated database of a test's own.
type Database struct {
	// URL connects to the database, for processes of the test's own.
	URL string
	// Pool is connected to the database.
	Pool *pgxpool.Pool

	name string
}

// New creates a database for the test, cloned from the migrated template,
// and drops it, connections and all, when the test ends. It fails the test
// if Postgres cannot be reached.
func New(tb testing.TB, opts *Options) *Database {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := NewDatabase(ctx, opts)
	if err != nil {
		tb.Fatalf("enginetest: %v", err)
	}
	tb.Cleanup(func() {
		if err := db.Close(); err != nil {
			tb.Errorf("enginetest: %v", err)
		}
	})
	return db
}

// NewDatabase creates a database cloned from the migrated template, for
// code without a testing.TB (a TestMain, an Example). Close drops it.
func NewDatabase(ctx context.Context, opts *Options) (*Database, error) {
	tmpl, err := template(ctx)
	if err != nil {
		return nil, err
	}
	name := "ratchet_test_" + strings.ToLower(ulid.Make().String())
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact(AdminURL()), err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, tmpl)); err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	db := &Database{URL: withDatabase(AdminURL(), name), name: name}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err == nil {
		if opts != nil && opts.MaxConns > 0 {
			cfg.MaxConns = opts.MaxConns
		}
		db.Pool, err = pgxpool.NewWithConfig(ctx, cfg)
	}
	if err != nil {
		db.Close() //nolint:errcheck // reporting the first failure
		return nil, fmt.Errorf("connect to the new database: %w", err)
	}
	return db, nil
}

// Close closes the pool and drops the database, ending any session still
// connected to it.
func (d *Database) Close() error {
	if d.Pool != nil {
		d.Pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return fmt.Errorf("connect to drop %s: %w", d.name, err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", d.name)); err != nil {
		return fmt.Errorf("drop database %s: %w", d.name, err)
	}
	return nil
}

// template returns the name of a migrated template database, building it if
// this schema version has none yet.
func template(ctx context.Context) (string, error) {
	templateOnce.Do(func() {
		templateName, templateErr = buildTemplate(ctx)
	})
	return templateName, templateErr
}

func buildTemplate(ctx context.Context) (string, error) {
	all, err := migrations.All()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, m := range all {
		fmt.Fprintf(h, "%s\x00%s\x00", m.Name, m.SQL)
	}
	// River's migrations are part of the schema too: an upgrade that adds
	// one builds a new template.
	riverMigrator, err := rivermigrate.New(riverpgxv5.New(nil), nil)
	if err != nil {
		return "", fmt.Errorf("river migrator: %w", err)
	}
	for _, m := range riverMigrator.AllVersions() {
		fmt.Fprintf(h, "river:%d\x00%s\x00", m.Version, m.SQLUp)
	}
	name := "ratchet_tmpl_" + hex.EncodeToString(h.Sum(nil))[:16]

	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return "", fmt.Errorf("connect to %s: %w", redact(AdminURL()), err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockKey); err != nil {
		return "", fmt.Errorf("lock: %w", err)
	}
	defer admin.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", templateLockKey) //nolint:errcheck // closing the connection releases it anyway

	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("look up template: %w", err)
	}
	if exists {
		return name, nil
	}

	// Build under a scratch name and rename when complete, so a build that
	// dies half-way never leaves a template that looks finished.
	scratch := name + "_build"
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+scratch+" WITH (FORCE)"); err != nil {
		return "", fmt.Errorf("drop scratch: %w", err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+scratch); err != nil {
		return "", fmt.Errorf("create template: %w", err)
	}
	pool, err := pgxpool.New(ctx, withDatabase(AdminURL(), scratch))
	if err != nil {
		return "", fmt.Errorf("connect to template: %w", err)
	}
	_, err = migrations.Apply(ctx, pool, nil)
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", scratch, name)); err != nil {
		return "", fmt.Errorf("rename template: %w", err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s WITH IS_TEMPLATE true", name)); err != nil {
		return "", fmt.Errorf("mark template: %w", err)
	}
	return name, nil
}

// withDatabase returns a connection string like dsn naming database db. Both
// URL and keyword/value forms are accepted; in the latter a later dbname
// setting overrides an earlier one.
func withDatabase(dsn, db string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err == nil {
			u.Path = "/" + db
			return u.String()
		}
	}
	return dsn + " dbname=" + db
}

func redact(dsn string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "the database"
	}
	return fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
}
