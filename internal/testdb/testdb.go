// Package testdb gives each test its own Postgres database, cloned from a
// template that has every migration applied. Cloning takes a fraction of a
// second, so tests that use it can run in parallel without sharing state.
//
// Postgres is found through DATABASE_URL, else at 127.0.0.1:5432 as the
// postgres user. The template is named after a hash of the embedded
// migrations, so a change to the schema builds a new one; building is
// serialised across test processes by an advisory lock.
package testdb

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

// AdminURL returns the connection string of the server's maintenance
// database, from DATABASE_URL or DefaultURL.
func AdminURL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Options adjust the pool New returns. A nil *Options is valid.
type Options struct {
	// MaxConns sizes the pool. Defaults to pgxpool's default.
	MaxConns int32
}

// New creates a fresh database from the migrated template and returns a pool
// connected to it. The database is dropped when the test ends.
func New(t testing.TB, opts *Options) *pgxpool.Pool {
	t.Helper()
	return Connect(t, NewURL(t), opts)
}

// Connect returns a pool on url that is closed when the test ends.
func Connect(t testing.TB, url string, opts *Options) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("testdb: parse config: %v", err)
	}
	if opts != nil && opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("testdb: connect: %v", err)
	}
	t.Cleanup(pool.Close) // runs before the drop registered by NewURL
	return pool
}

// NewURL creates a fresh database from the migrated template and returns its
// connection string, for tests that start processes of their own. The
// database is dropped, connections and all, when the test ends.
func NewURL(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	tmpl, err := template(ctx)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	name := "ratchet_test_" + strings.ToLower(ulid.Make().String())
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Fatalf("testdb: connect to %s: %v", redact(AdminURL()), err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, tmpl)); err != nil {
		t.Fatalf("testdb: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, AdminURL())
		if err != nil {
			t.Errorf("testdb: connect for drop: %v", err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name)); err != nil {
			t.Errorf("testdb: drop database %s: %v", name, err)
		}
	})
	return withDatabase(AdminURL(), name)
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
