package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// Schema is the Postgres schema that holds Ratchet's tables and River's.
const Schema = "ratchet"

// lockKey is the advisory lock that serialises concurrent Apply calls. It is
// an arbitrary constant: the bytes of "ratchet!" read as a big-endian int64.
const lockKey int64 = 0x7261746368657421

//go:embed sql/*.sql
var sqlFiles embed.FS

// Migration is one embedded SQL file.
type Migration struct {
	Version int    // from the file name's numeric prefix
	Name    string // file name without directory
	SQL     string
	// Contract marks a migration that drops what only earlier releases
	// use (its first line is contractMarker). This release works with it
	// applied or not, so Check does not ask for it, and Apply with
	// KeepCompatible leaves it for after every process runs this release.
	// Later migrations never depend on one.
	Contract bool
}

// contractMarker, as the first line of a migration, makes it a contract
// migration.
const contractMarker = "-- ratchet:contract"

// All returns the embedded migrations in version order.
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(sqlFiles, "sql")
	if err != nil {
		return nil, fmt.Errorf("migrations: read embedded files: %w", err)
	}
	var all []Migration
	for _, e := range entries {
		prefix, _, ok := strings.Cut(e.Name(), "_")
		version, err := strconv.Atoi(prefix)
		if !ok || err != nil || version <= 0 {
			return nil, fmt.Errorf("migrations: file %q does not start with a positive version number", e.Name())
		}
		body, err := fs.ReadFile(sqlFiles, path.Join("sql", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("migrations: read %s: %w", e.Name(), err)
		}
		first, _, _ := strings.Cut(string(body), "\n")
		all = append(all, Migration{Version: version, Name: e.Name(), SQL: string(body),
			Contract: strings.TrimSpace(first) == contractMarker})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Version < all[j].Version })
	for i := 1; i < len(all); i++ {
		if all[i].Version == all[i-1].Version {
			return nil, fmt.Errorf("migrations: version %d appears twice (%s, %s)", all[i].Version, all[i-1].Name, all[i].Name)
		}
	}
	return all, nil
}

// discard is the logger of a caller that gave none (River's migrator would
// otherwise print to stdout).
var discard = slog.New(slog.DiscardHandler)

// ApplyOpts are options for Apply. A nil *ApplyOpts is valid.
type ApplyOpts struct {
	// Logger receives one line per applied migration. Defaults to discarding.
	Logger *slog.Logger
	// KeepCompatible leaves contract migrations unapplied, so that
	// processes of the previous release, still running during a rolling
	// upgrade, find what they use. Apply again without it once none is
	// left.
	KeepCompatible bool
}

// Result reports what Apply changed.
type Result struct {
	// Applied lists the Ratchet migrations applied by this call, by file name.
	Applied []string
	// Deferred lists the contract migrations left unapplied because of
	// KeepCompatible, by file name.
	Deferred []string
	// RiverVersions lists River's migration versions applied by this call.
	RiverVersions []int
}

// Apply creates the ratchet schema if needed and applies every pending Ratchet
// migration (each in its own transaction) and then River's. It holds an
// advisory lock for its whole duration, so concurrent callers run one after
// the other and the later ones find nothing to do.
func Apply(ctx context.Context, pool *pgxpool.Pool, opts *ApplyOpts) (*Result, error) {
	if opts == nil {
		opts = &ApplyOpts{}
	}
	logger := opts.Logger
	if logger == nil {
		logger = discard
	}
	all, err := All()
	if err != nil {
		return nil, err
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: acquire connection: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return nil, fmt.Errorf("migrations: take advisory lock: %w", err)
	}
	defer func() {
		// A session lock outlives a failed unlock only until the connection
		// closes, so close it rather than return it to the pool still locked.
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()

	res := &Result{}
	if err := applyRatchet(ctx, conn.Conn(), all, opts.KeepCompatible, logger, res); err != nil {
		return nil, err
	}

	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger, Schema: Schema})
	if err != nil {
		return nil, fmt.Errorf("migrations: river migrator: %w", err)
	}
	riverRes, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return nil, fmt.Errorf("migrations: river: %w", err)
	}
	for _, v := range riverRes.Versions {
		res.RiverVersions = append(res.RiverVersions, v.Version)
	}
	return res, nil
}

const createBookkeepingSQL = `
CREATE SCHEMA IF NOT EXISTS ratchet;
CREATE TABLE IF NOT EXISTS ratchet.schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`

func applyRatchet(ctx context.Context, conn *pgx.Conn, all []Migration, keepCompatible bool, logger *slog.Logger, res *Result) error {
	if _, err := conn.Exec(ctx, createBookkeepingSQL); err != nil {
		return fmt.Errorf("migrations: create schema: %w", err)
	}
	applied, err := appliedVersions(ctx, conn)
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		// A schema this call creates: migrations that choose defaults for
		// a new database rather than an existing one read it (0022).
		if _, err := conn.Exec(ctx, "SELECT set_config('ratchet.fresh_schema', 'on', false)"); err != nil {
			return fmt.Errorf("migrations: mark a fresh schema: %w", err)
		}
		defer conn.Exec(context.WithoutCancel(ctx), "RESET ratchet.fresh_schema") //nolint:errcheck // a session setting of a pooled connection; nothing else reads it
	}
	for _, m := range all {
		if applied[m.Version] {
			continue
		}
		if m.Contract && keepCompatible {
			res.Deferred = append(res.Deferred, m.Name)
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO ratchet.schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
			return err
		})
		if err != nil {
			return fmt.Errorf("migrations: apply %s: %w", m.Name, err)
		}
		logger.InfoContext(ctx, "applied migration", slog.String("migration", m.Name))
		res.Applied = append(res.Applied, m.Name)
	}
	return nil
}

func appliedVersions(ctx context.Context, conn *pgx.Conn) (map[int]bool, error) {
	rows, err := conn.Query(ctx, "SELECT version FROM ratchet.schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("migrations: read applied versions: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("migrations: read applied versions: %w", err)
	}
	applied := make(map[int]bool, len(versions))
	for _, v := range versions {
		applied[v] = true
	}
	return applied, nil
}

// ErrPending is returned by Check when migrations remain to be applied.
var ErrPending = errors.New("migrations: database schema is not current")

// Check reports whether every Ratchet and River migration has been
// applied, contract migrations aside (this release works without them).
// It returns ErrPending (wrapped, naming what is missing) when not.
func Check(ctx context.Context, pool *pgxpool.Pool) error {
	all, err := All()
	if err != nil {
		return err
	}
	var present bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('ratchet.schema_migrations') IS NOT NULL").Scan(&present); err != nil {
		return fmt.Errorf("migrations: check: %w", err)
	}
	if !present {
		return fmt.Errorf("%w: ratchet schema missing", ErrPending)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrations: acquire connection: %w", err)
	}
	applied, err := appliedVersions(ctx, conn.Conn())
	conn.Release()
	if err != nil {
		return err
	}
	for _, m := range all {
		if !applied[m.Version] && !m.Contract {
			return fmt.Errorf("%w: %s not applied", ErrPending, m.Name)
		}
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: discard, Schema: Schema})
	if err != nil {
		return fmt.Errorf("migrations: river migrator: %w", err)
	}
	v, err := migrator.Validate(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrations: river: %w", err)
	}
	if !v.OK {
		return fmt.Errorf("%w: river: %s", ErrPending, strings.Join(v.Messages, "; "))
	}
	return nil
}
