package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// backendSampler attributes Postgres's CPU time to a benchmark by the
// backends of the benchmark's own database, which pg_stat_activity names
// with their pids, rather than by every postgres process on the host:
// other clients of the cluster start and end backends during a
// measurement, and counting those in and out made the share meaningless
// (even negative). It also counts the database's connections.
//
// A backend seen before the measurement starts counts from its first
// sample; one that started during it counts whole. A backend's last
// moments before it exits, after its last sample, are missed, so the
// figure is a lower bound; the server's shared processes (WAL writer,
// checkpointer) are no one client's and are left out.
type backendSampler struct {
	local    bool      // the server is on this host, its pids are ours to read
	since    time.Time // the measurement's start, by the server's clock
	backends map[backendID]*backendTicks
	most     int // connections, the most seen at once
}

// backendID names a backend; with its start, a pid reused by a later
// backend is another backend.
type backendID struct {
	pid   int
	start time.Time
}

type backendTicks struct{ first, last int64 }

func newBackendSampler(local bool, since time.Time) *backendSampler {
	return &backendSampler{local: local, since: since, backends: map[backendID]*backendTicks{}}
}

// run samples every interval until ctx ends, and once more then.
func (s *backendSampler) run(ctx context.Context, pool *pgxpool.Pool, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			// The last sample, with a context of its own: the one that
			// ended the measurement is done.
			last, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			s.sample(last, pool)
			cancel()
			return
		default:
		}
		s.sample(ctx, pool)
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// sample reads the database's backends and the CPU time of each. A failed
// read is a missed sample, not an error: the figure stays a lower bound.
func (s *backendSampler) sample(ctx context.Context, pool *pgxpool.Pool) {
	rows, _ := pool.Query(ctx, `SELECT pid, backend_start FROM pg_stat_activity WHERE datname = current_database() AND backend_start IS NOT NULL`)
	ids, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (backendID, error) {
		var id backendID
		err := row.Scan(&id.pid, &id.start)
		return id, err
	})
	if err != nil {
		return
	}
	s.most = max(s.most, len(ids))
	if !s.local {
		return
	}
	for _, id := range ids {
		ticks, ok := postgresTicks(id.pid)
		if !ok {
			continue
		}
		b := s.backends[id]
		if b == nil {
			b = &backendTicks{}
			if id.start.Before(s.since) {
				b.first = ticks
			}
			s.backends[id] = b
		}
		// A process's CPU time never falls; a lower reading is the pid of
		// another process read between the query and /proc.
		b.last = max(b.last, ticks, b.first)
	}
}

// ticks is the CPU time the benchmark's backends spent in the measurement,
// and false when none could be attributed: the server is on another host,
// or its processes are not visible from here (another PID namespace).
func (s *backendSampler) ticks() (int64, bool) {
	var sum int64
	for _, b := range s.backends {
		sum += b.last - b.first
	}
	return sum, len(s.backends) > 0
}

// postgresTicks is the CPU time of process pid when it is a postgres
// process of this host.
func postgresTicks(pid int) (int64, bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	comm, err := os.ReadFile(dir + "/comm")
	if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
		return 0, false
	}
	return procTicks(dir)
}

// procTicks is the user and system time of the process at dir, in clock
// ticks (USER_HZ, 100 a second on Linux), and false when it cannot be read
// (the process is gone).
func procTicks(dir string) (int64, bool) {
	b, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return 0, false
	}
	// The fields after the command name, which is in parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	var sum int64
	for _, v := range f[11:13] { // utime, stime
		ticks, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false
		}
		sum += ticks
	}
	return sum, true
}
