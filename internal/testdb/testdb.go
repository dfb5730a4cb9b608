// Package testdb is the test kit's database for Ratchet's own tests, with
// the shapes they use: a pool, or a URL for processes of a test's own.
package testdb

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oklog/ulid/v2"

	"github.com/ratchet-run/ratchet/engine/enginetest"
)

// Options adjust the pool New and Connect return. A nil *Options is valid.
type Options = enginetest.Options

// AdminURL returns the connection string of the server tests create
// databases on.
func AdminURL() string { return enginetest.AdminURL() }

// New creates a fresh migrated database and returns a pool connected to
// it. The database is dropped when the test ends.
func New(t testing.TB, opts *Options) *pgxpool.Pool {
	t.Helper()
	return enginetest.New(t, opts).Pool
}

// NewURL creates a fresh migrated database and returns its connection
// string. The database is dropped, connections and all, when the test ends.
func NewURL(t testing.TB) string {
	t.Helper()
	return enginetest.New(t, &Options{MaxConns: 1}).URL
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

// NewEmpty creates a database with nothing in it — not migrated, as an
// adopter's is before `ratchet migrate` — and returns a pool on it. The
// database is dropped when the test ends.
func NewEmpty(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	admin := Connect(t, AdminURL(), &Options{MaxConns: 1})
	name := "ratchet_empty_" + strings.ToLower(ulid.Make().String())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testdb: create database: %v", err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)") })
	cfg, err := pgxpool.ParseConfig(AdminURL())
	if err != nil {
		t.Fatalf("testdb: parse config: %v", err)
	}
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testdb: connect: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
