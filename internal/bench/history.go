package bench

import (
	"cmp"
	"context"
	"crypto/md5"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
)

// seedHistorySQL writes runs $1 to $2 of a history of $3 runs as a payment
// service's looks: 2% of them another tenant's, five workflows and a rare
// sixth, each run with three phases, two of them steps with child keys.
// The runs in flight are among the newest 10,000 (a third of those:
// pending, running, sleeping, compensating); the older ones finished:
// 97.5% succeeded, the rest failed, cancelled or compensated. Ids grow
// with i as ULIDs grow with time. Idempotency keys ("order-" and 32 hex
// digits) and child keys ("rk1_" and 32 characters spread over the
// alphabet of real ones) are scattered as real ones are, so that a new
// run's keys land at random places among them (HistoryKey makes a new
// run's idempotency key alike). Every run is of child-key format 3, and
// its steps' keys are in the index of format-1 keys, as a format-1 run's
// are: each format's new runs insert into an index as large as the
// history (so the bytes per run of the history count the format-1 index,
// which a history of format 3 alone does not have).
var seedHistorySQL = []string{`
INSERT INTO ratchet.runs (id, tenant, idempotency_key, workflow, workflow_version, input, fingerprint,
	status, recovery_point, lease_owner, lease_token, lease_expires_at, attempt, next_attempt_at,
	output, created_at, updated_at, finished_at, expires_at, waiting_for, key_format)
SELECT lpad(i::text, 26, '0'),
	CASE WHEN i % 50 = 0 THEN 'acme' ELSE 'default' END,
	'order-' || md5(i::text),
	CASE WHEN i % 1000 = 7 THEN 'audit' ELSE (ARRAY['payment', 'refund', 'payout', 'order', 'invoice'])[1 + i % 5] END,
	1, jsonb_build_object('amount', i % 9000), sha256(i::text::bytea),
	s.status, 'receipt_sent',
	CASE WHEN s.status = 'running' THEN 'worker-1' END,
	CASE WHEN s.status = 'running' THEN 1 ELSE 0 END,
	CASE WHEN s.status = 'running' THEN now() + interval '1 hour' END,
	1,
	CASE WHEN s.status = 'waiting' THEN now() + interval '1 hour' END,
	CASE WHEN s.finished THEN '{"ok": true}'::jsonb END,
	now(), now(),
	CASE WHEN s.finished THEN now() END,
	CASE WHEN s.finished THEN now() + interval '30 days' END,
	CASE WHEN s.status = 'waiting' THEN jsonb_build_object('kind', 'sleep', 'phase', 'cooled_off', 'seq', 3, 'until', now() + interval '1 hour') END,
	3
FROM generate_series($1::bigint, $2::bigint) i,
LATERAL (SELECT st AS status, st IN ('succeeded', 'failed', 'cancelled', 'compensated') AS finished FROM (SELECT CASE
	WHEN i > $3 - 10000 AND i % 3 = 0 THEN (ARRAY['pending', 'running', 'waiting', 'waiting', 'compensating'])[1 + i / 3 % 5]
	WHEN i % 1000 < 975 THEN 'succeeded' WHEN i % 1000 < 990 THEN 'failed'
	WHEN i % 1000 < 995 THEN 'cancelled' ELSE 'compensated' END AS st) x) s`, `
INSERT INTO ratchet.phases (run_id, seq, name, kind, output, child_key, attempts, started_at, finished_at, execution)
SELECT lpad(i::text, 26, '0'), p.seq, p.name, p.kind, to_jsonb(i),
	CASE WHEN p.kind = 'step' THEN 'rk1_' || substr(lower(translate(encode(sha256((i::text || p.name)::bytea), 'base64'), '+/=', 'abc')), 1, 32) END,
	1, now(), now(), 1
FROM generate_series($1::bigint, $2::bigint) i,
	(VALUES (0, 'charged', 'step'), (1, 'ledger_posted', 'atomic'), (2, 'receipt_sent', 'step')) p(seq, name, kind)
WHERE $3 > 0`}

// SeedHistory writes runs lo to hi (counting from 1) of a history of total
// runs by SQL, in batches, reporting progress; see seedHistorySQL for its
// shape. From a million runs at once, the indexes and key constraints of
// runs and phases are dropped first and built again after the rows (the
// same definitions), which nothing may rely on meanwhile.
func SeedHistory(ctx context.Context, pool *pgxpool.Pool, lo, hi, total int, progress func(done int)) error {
	const batch = 250_000
	if hi-lo+1 >= bulkSeed {
		// Scattered keys inserted into live indexes touch a random page per
		// row and slow each further million; built afterwards, each index
		// is one sort.
		rebuild, err := dropRunIndexes(ctx, pool)
		if err != nil {
			return err
		}
		if err := seedRows(ctx, pool, lo, hi, total, batch, progress); err != nil {
			return err
		}
		if err := rebuild(); err != nil {
			return err
		}
		_, err = pool.Exec(ctx, `VACUUM ANALYZE ratchet.runs, ratchet.phases`)
		return err
	}
	if err := seedRows(ctx, pool, lo, hi, total, batch, progress); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `VACUUM ANALYZE ratchet.runs, ratchet.phases`)
	return err
}

// bulkSeed is the size of a seed from which indexes are built after the
// rows rather than maintained row by row.
var bulkSeed = 1_000_000

// seedRows inserts runs lo to hi, batch at a time.
func seedRows(ctx context.Context, pool *pgxpool.Pool, lo, hi, total, batch int, progress func(done int)) error {
	for from := lo; from <= hi; from += batch {
		to := min(from+batch-1, hi)
		for _, sql := range seedHistorySQL {
			if _, err := pool.Exec(ctx, sql, from, to, total); err != nil {
				return fmt.Errorf("seed runs %d to %d: %w", from, to, err)
			}
		}
		if progress != nil {
			progress(to)
		}
	}
	return nil
}

// dropRunIndexes drops the indexes and key constraints of runs and phases
// (and the foreign keys that reference runs) and returns the function that
// builds them again from their definitions, as they were.
func dropRunIndexes(ctx context.Context, pool *pgxpool.Pool) (rebuild func() error, err error) {
	type def struct{ table, name, def string }
	var constraints, foreign, indexes []def
	rows, err := pool.Query(ctx, `
		SELECT conrelid::regclass::text, quote_ident(conname), pg_get_constraintdef(oid), contype = 'f'
		FROM pg_constraint
		WHERE (conrelid IN ('ratchet.runs'::regclass, 'ratchet.phases'::regclass) AND contype IN ('p', 'u', 'f'))
			OR confrelid = 'ratchet.runs'::regclass`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var d def
		var fk bool
		if err := rows.Scan(&d.table, &d.name, &d.def, &fk); err != nil {
			return nil, err
		}
		if fk {
			foreign = append(foreign, d)
		} else {
			constraints = append(constraints, d)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = pool.Query(ctx, `
		SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid)
		FROM pg_index
		WHERE indrelid IN ('ratchet.runs'::regclass, 'ratchet.phases'::regclass)
			AND NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conindid = indexrelid)`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var d def
		if err := rows.Scan(&d.name, &d.def); err != nil {
			return nil, err
		}
		indexes = append(indexes, d)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var drops []string
	for _, d := range foreign {
		drops = append(drops, "ALTER TABLE "+d.table+" DROP CONSTRAINT "+d.name)
	}
	for _, d := range constraints {
		drops = append(drops, "ALTER TABLE "+d.table+" DROP CONSTRAINT "+d.name)
	}
	for _, d := range indexes {
		drops = append(drops, "DROP INDEX "+d.name)
	}
	for _, sql := range drops {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return nil, fmt.Errorf("%s: %w", sql, err)
		}
	}
	return func() error {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		builds := []string{"SET maintenance_work_mem = '1GB'"}
		for _, d := range constraints {
			builds = append(builds, "ALTER TABLE "+d.table+" ADD CONSTRAINT "+d.name+" "+d.def)
		}
		for _, d := range indexes {
			builds = append(builds, d.def)
		}
		for _, d := range foreign {
			builds = append(builds, "ALTER TABLE "+d.table+" ADD CONSTRAINT "+d.name+" "+d.def)
		}
		builds = append(builds, "RESET maintenance_work_mem")
		for _, sql := range builds {
			if _, err := conn.Exec(ctx, sql); err != nil {
				return fmt.Errorf("%s: %w", sql, err)
			}
		}
		return nil
	}, nil
}

// HistoryOptions configure History. Zero fields take the defaults given.
type HistoryOptions struct {
	// Sizes are the history sizes measured at, in runs, ascending.
	// Defaults to 0 and 1,000,000.
	Sizes []int
	// Runs is how many runs are executed and measured at each size.
	// Defaults to 20,000.
	Runs int
	// Concurrency is the number of callers starting runs at once.
	// Defaults to 16.
	Concurrency int
	// KeyFormats are the child-key formats measured at each size, one
	// after the other (engine.Config.KeyFormat). Defaults to 1 and 2.
	KeyFormats []int
	// Duration, when positive, makes each measurement last this long
	// rather than Runs runs. The server's checkpoint_timeout measures a
	// whole checkpoint cycle: the steady state, where a page is written
	// whole once per cycle however many runs touch it in it.
	Duration time.Duration
	// WALCompression lists values of the wal_compression setting each
	// measurement is repeated with, set on the engine's connections
	// (which needs a superuser or the privilege to set it). Defaults to
	// the server's own setting alone ("").
	WALCompression []string
}

// historyConfig is one configuration History measures at each size.
type historyConfig struct {
	format      int
	compression string // "": the server's setting
}

// History measures what a run costs as history grows: at each size it
// seeds the history up to that many runs by SQL and then, for each
// child-key format, checkpoints and executes opts.Runs runs of a
// payment-shaped workflow (a step, an atomic phase, a step: two child
// keys) with a plain engine client, reporting the WAL per run (and the
// full-page images in it), the rate and latency, and the bytes per run of
// every table and index at the end.
//
// Each measurement starts at a checkpoint, so that the first change to
// each page after it writes that page whole, as after any checkpoint: an
// index into which runs insert at random places touches a new page for
// nearly every run, one into which they insert in time order touches a
// few. pg_stat_wal counts the whole server's WAL: measure on a server
// with nothing else to do.
func History(ctx context.Context, pool *pgxpool.Pool, opts HistoryOptions, out, progress io.Writer) error {
	if len(opts.Sizes) == 0 {
		opts.Sizes = []int{0, 1_000_000}
	}
	if opts.Runs == 0 {
		opts.Runs = 20_000
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = 16
	}
	if len(opts.KeyFormats) == 0 {
		opts.KeyFormats = []int{1, 2}
	}
	if !slices.IsSorted(opts.Sizes) {
		return fmt.Errorf("bench: history sizes %v are not ascending", opts.Sizes)
	}
	if len(opts.WALCompression) == 0 {
		opts.WALCompression = []string{""}
	}
	workflows := engine.NewWorkflows()
	if err := registerPayment(workflows); err != nil {
		return err
	}
	var configs []historyConfig
	clients := map[historyConfig]*engine.Client{}
	for _, compression := range opts.WALCompression {
		p := pool
		if compression != "" {
			cfg := pool.Config()
			cfg.ConnConfig.RuntimeParams["wal_compression"] = compression
			var err error
			if p, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
				return err
			}
			defer p.Close()
			if err := p.Ping(ctx); err != nil {
				return fmt.Errorf("bench: wal_compression = %s: %w", compression, err)
			}
		}
		for _, f := range opts.KeyFormats {
			c, err := engine.NewClient(p, &engine.Config{Workflows: workflows, KeyFormat: f})
			if err != nil {
				return err
			}
			hc := historyConfig{format: f, compression: compression}
			configs = append(configs, hc)
			clients[hc] = c
		}
	}
	type row struct {
		size int
		historyConfig
		res   Result
		wal   walStats
		sizes []relationSize
	}
	var rows []row
	seeded, executed := 0, 0
	for _, size := range opts.Sizes {
		if size > seeded {
			began := time.Now()
			err := SeedHistory(ctx, pool, seeded+1, size, size, func(done int) {
				fmt.Fprintf(progress, "seeded %d of %d runs (%s)\n", done, size, time.Since(began).Round(time.Second))
			})
			if err != nil {
				return err
			}
			seeded = size
		}
		for _, hc := range configs {
			if size == 0 && executed > 0 {
				// The empty history is empty for each configuration.
				if _, err := pool.Exec(ctx, `TRUNCATE ratchet.runs CASCADE`); err != nil {
					return fmt.Errorf("bench: empty the history: %w", err)
				}
				executed = 0
			}
			if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
				return fmt.Errorf("bench: checkpoint (the role needs pg_checkpoint or superuser): %w", err)
			}
			before, err := readWAL(ctx, pool)
			if err != nil {
				return err
			}
			fmt.Fprintf(progress, "history of %d runs: executing %s, child keys of format %d, wal_compression %s\n",
				seeded+executed, measurementLength(opts), hc.format, cmp.Or(hc.compression, "as the server's"))
			c := clients[hc]
			n := opts.Runs
			if opts.Duration > 0 {
				n = 0
			}
			res, err := Drive(ctx, opts.Concurrency, n, opts.Duration, func(ctx context.Context, i int) error {
				key := HistoryKey(fmt.Sprintf("bench-%d-%d-%s-%d", size, hc.format, hc.compression, i))
				res, err := c.Start(ctx, engine.StartParams{Workflow: "payment3", IdempotencyKey: key, Input: []byte(`{}`)})
				if err == nil && res.Run.Status != engine.StatusSucceeded {
					err = fmt.Errorf("run %s ended %s", key, res.Run.Status)
				}
				return err
			})
			if err != nil {
				return err
			}
			after, err := readWAL(ctx, pool)
			if err != nil {
				return err
			}
			executed += res.Ops
			sizes, err := relationSizes(ctx, pool)
			if err != nil {
				return err
			}
			rows = append(rows, row{size: size, historyConfig: hc, res: res, wal: after.sub(before), sizes: sizes})
		}
	}

	fmt.Fprintf(out, "%s of a payment-shaped workflow (step, atomic, step) at concurrency %d, from a checkpoint, at each history size and configuration\n",
		measurementLength(opts), opts.Concurrency)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "history\tkey format\twal_compression\truns\truns/s\tp50 ms\tp99 ms\tWAL bytes/run\tfull-page images/run\tvs. empty history\tcheckpoints\t")
	first := map[historyConfig]float64{}
	for _, r := range rows {
		per := float64(r.wal.bytes) / float64(r.res.Ops)
		if _, ok := first[r.historyConfig]; !ok {
			first[r.historyConfig] = per
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%.0f\t%s\t%s\t%.0f\t%.2f\t%.2f×\t%d\t\n", r.size, r.format, cmp.Or(r.compression, "server's"), r.res.Ops, r.res.Rate(),
			ms(r.res.P50), ms(r.res.P99), per, float64(r.wal.fpi)/float64(r.res.Ops), per/first[r.historyConfig], r.wal.checkpoints)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	last := rows[len(rows)-1]
	total := seeded + executed
	fmt.Fprintf(out, "\nbytes per run of each relation at %d runs\n", total)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "relation\tbytes/run\t")
	for _, s := range last.sizes {
		fmt.Fprintf(tw, "%s\t%.0f\t\n", s.name, float64(s.bytes)/float64(total))
	}
	return tw.Flush()
}

// measurementLength says how long each of History's measurements lasts.
func measurementLength(opts HistoryOptions) string {
	if opts.Duration > 0 {
		return opts.Duration.String()
	}
	return fmt.Sprintf("%d runs", opts.Runs)
}

// HistoryKey is an idempotency key like the seeded history's: "order-"
// and the MD5 of seed in hex.
func HistoryKey(seed string) string {
	return fmt.Sprintf("order-%x", md5.Sum([]byte(seed)))
}

// walStats are pg_stat_wal's counters.
type walStats struct {
	bytes, fpi, records int64
	checkpoints         int64 // begun, timed or requested
}

func (w walStats) sub(earlier walStats) walStats {
	return walStats{bytes: w.bytes - earlier.bytes, fpi: w.fpi - earlier.fpi, records: w.records - earlier.records,
		checkpoints: w.checkpoints - earlier.checkpoints}
}

func readWAL(ctx context.Context, pool *pgxpool.Pool) (walStats, error) {
	var w walStats
	// The LSN counts bytes exactly; pg_stat_wal counts images and records.
	err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, wal_fpi, wal_records FROM pg_stat_wal`).
		Scan(&w.bytes, &w.fpi, &w.records)
	if err != nil {
		return w, fmt.Errorf("bench: read WAL position: %w", err)
	}
	// Postgres 17 moved the checkpoint counters to a view of their own.
	var checkpointer bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_stat_checkpointer') IS NOT NULL`).Scan(&checkpointer); err != nil {
		return w, fmt.Errorf("bench: read checkpoints: %w", err)
	}
	q := `SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`
	if checkpointer {
		q = `SELECT num_timed + num_requested FROM pg_stat_checkpointer`
	}
	if err := pool.QueryRow(ctx, q).Scan(&w.checkpoints); err != nil {
		return w, fmt.Errorf("bench: read checkpoints: %w", err)
	}
	return w, nil
}

type relationSize struct {
	name  string
	bytes int64
}

// relationSizes lists the sizes of runs, phases and their indexes,
// biggest first.
func relationSizes(ctx context.Context, pool *pgxpool.Pool) ([]relationSize, error) {
	rows, err := pool.Query(ctx, `SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c
WHERE c.oid IN ('ratchet.runs'::regclass, 'ratchet.phases'::regclass)
	OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid IN ('ratchet.runs'::regclass, 'ratchet.phases'::regclass))
ORDER BY 2 DESC`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (relationSize, error) {
		var s relationSize
		return s, r.Scan(&s.name, &s.bytes)
	})
}

// registerPayment registers "payment3": a step, an atomic phase and a
// step, each doing nothing but commit; the steps send child keys.
func registerPayment(workflows *engine.Workflows) error {
	type receipt struct {
		ID string `json:"id"`
	}
	call := func(_ context.Context, key steps.Key) (receipt, error) { return receipt{ID: string(key)}, nil }
	noop := func(context.Context, pgx.Tx) (struct{}, error) { return struct{}{}, nil }
	_, err := engine.Register(workflows, "payment3", func(ctx context.Context, _ struct{}) (struct{}, error) {
		if _, err := engine.Step(ctx, "charged", call, nil); err != nil {
			return struct{}{}, err
		}
		if _, err := engine.Atomic(ctx, "ledger_posted", noop, nil); err != nil {
			return struct{}{}, err
		}
		_, err := engine.Step(ctx, "receipt_sent", call, nil)
		return struct{}{}, err
	}, nil)
	return err
}
