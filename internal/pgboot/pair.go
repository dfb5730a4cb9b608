package pgboot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Pair is a throwaway primary and a standby streaming from it, for the
// failover chaos command. Both run from one temporary directory; Stop
// stops whichever still runs and deletes it.
type Pair struct {
	Primary, Standby *Cluster
	// URL connects to whichever of the two accepts writes (a multi-host
	// connection string with target_session_attrs=read-write).
	URL string
	// Sync says whether commits wait for the standby to have the WAL.
	Sync     bool
	dir      string
	killedAt time.Time
}

// standbyName is the standby's application_name, the name the primary's
// synchronous_standby_names lists.
const standbyName = "standby"

// StartPair initialises a primary, takes a base backup of it for a
// standby, and starts both, the standby streaming. With sync, the primary
// lists the standby in synchronous_standby_names: a commit returns once
// the standby has flushed its WAL (synchronous_commit on).
func StartPair(ctx context.Context, sync bool) (*Pair, error) {
	primary, err := Start(ctx)
	if err != nil {
		return nil, err
	}
	p := &Pair{Primary: primary, Sync: sync, dir: primary.Dir}
	fail := func(err error) (*Pair, error) {
		_ = p.Stop()
		return nil, err
	}
	// The standby lives beside the primary, in the same directory.
	standby := &Cluster{Bin: primary.Bin, Dir: primary.Dir, cred: primary.cred}
	port, err := freePort()
	if err != nil {
		return fail(err)
	}
	primaryPort := portOf(primary.URL)
	data := filepath.Join(primary.Dir, "standby")
	if err := standby.run(ctx, "pg_basebackup", "-D", data, "-X", "stream", "-R", "--no-sync", "-c", "fast",
		"-d", fmt.Sprintf("host=127.0.0.1 port=%s user=postgres application_name=%s", primaryPort, standbyName)); err != nil {
		return fail(err)
	}
	// wal_retrieve_retry_interval: a standby whose WAL receiver has just
	// lost the primary waits this long before it looks for WAL again, and
	// a promotion asked meanwhile waits with it — 5 s at the default,
	// measured as the gap between the kill and the first answer in about
	// half the failovers here. A standby meant for promotion wants it short.
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c wal_retrieve_retry_interval=100ms", port, primary.Dir)
	if err := standby.run(ctx, "pg_ctl", "-D", data, "-l", filepath.Join(primary.Dir, "standby.log"), "-o", opts, "-w", "-t", "60", "start"); err != nil {
		return fail(err)
	}
	standby.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	standby.data = data
	p.Standby = standby
	if sync {
		if err := exec1(ctx, primary.URL, `ALTER SYSTEM SET synchronous_standby_names = '`+standbyName+`'`, `SELECT pg_reload_conf()`); err != nil {
			return fail(err)
		}
	}
	if err := awaitStreaming(ctx, primary.URL, sync); err != nil {
		return fail(err)
	}
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%s,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write", primaryPort, port)
	return p, nil
}

// awaitStreaming waits up to 90 seconds until the primary at url reports
// its one standby streaming, and synchronous or asynchronous as sync says.
func awaitStreaming(ctx context.Context, url string, sync bool) error {
	want := "async"
	if sync {
		want = "sync"
	}
	var state, syncState string
	var last error
	err := until(ctx, 90*time.Second, func() bool {
		last = query1(ctx, url, `SELECT state, sync_state FROM pg_stat_replication`, nil, &state, &syncState)
		return last == nil && state == "streaming" && syncState == want
	})
	if err != nil {
		return fmt.Errorf("the standby is not streaming (%s): %s %s %v: %w", want, state, syncState, last, err)
	}
	return nil
}

// until calls done every 50 ms until it returns true, for at most within.
func until(ctx context.Context, within time.Duration, done func() bool) error {
	deadline := time.Now().Add(within)
	for !done() {
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up after %s", within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// Fail kills the primary and all its processes (SIGKILL: a crash, with no
// shutdown and no last WAL sent) and promotes the standby, waiting until
// it accepts writes.
func (p *Pair) Fail(ctx context.Context) error {
	if err := p.Primary.kill(); err != nil {
		return err
	}
	p.killedAt = time.Now()
	p.Primary.stopped = true
	return p.Standby.run(ctx, "pg_ctl", "-D", p.Standby.data, "-w", "-t", "60", "promote")
}

// KilledAt is when Fail's kill had completed: no answer can come from the
// old primary after it.
func (p *Pair) KilledAt() time.Time { return p.killedAt }

// Switchover is the manager's: a Pair has none.
func (p *Pair) Switchover(context.Context) error {
	return errors.New("pgboot: a switchover is an HA manager's; this pair has none (use Patroni)")
}

// Lag is how many bytes of WAL the primary has written that the standby
// has not yet received and flushed: what a promotion now would lose.
func (p *Pair) Lag(ctx context.Context) (int64, error) {
	return lagOf(ctx, p.Primary.URL)
}

// lagOf is how many bytes of WAL the primary at url has written that its
// standby has not yet flushed.
func lagOf(ctx context.Context, url string) (int64, error) {
	var lag int64
	err := query1(ctx, url, `SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)), 0)::bigint FROM pg_stat_replication`, nil, &lag)
	return lag, err
}

// Stall stops the primary's WAL sender (SIGSTOP), as a slow or broken
// link would: the standby receives nothing more. A synchronous primary's
// commits wait meanwhile; an asynchronous one's do not. Fail ends it.
func (p *Pair) Stall(ctx context.Context) error {
	return stallWALSender(ctx, p.Primary.URL)
}

// stallWALSender stops (SIGSTOP) the WAL sender of the primary at url,
// which streams to one standby.
func stallWALSender(ctx context.Context, url string) error {
	// The standby may be between two connections (Patroni restarts a
	// replica now and then, as after applying its configuration): wait for
	// the next.
	var pid int
	var last error
	if err := until(ctx, 30*time.Second, func() bool {
		last = query1(ctx, url, `SELECT pid FROM pg_stat_replication WHERE state = 'streaming'`, nil, &pid)
		return last == nil
	}); err != nil {
		return fmt.Errorf("find the primary's WAL sender: %v: %w", last, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("stop the WAL sender: %w", err)
	}
	return nil
}

// Stop stops both servers and deletes their directory.
func (p *Pair) Stop() error {
	var errs []error
	for _, c := range []*Cluster{p.Standby, p.Primary} {
		if c != nil && !c.stopped {
			errs = append(errs, c.stop())
		}
	}
	return errors.Join(append(errs, os.RemoveAll(p.dir))...)
}

func portOf(url string) string {
	rest := url[strings.LastIndex(url, ":")+1:]
	return rest[:strings.IndexByte(rest, '/')]
}

func exec1(ctx context.Context, url string, sqls ...string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, sql := range sqls {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

func query1(ctx context.Context, url, sql string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// kill kills the server's postmaster and every process it started, and
// waits until they are gone.
func (c *Cluster) kill() error {
	raw, err := os.ReadFile(filepath.Join(c.data, "postmaster.pid"))
	if err != nil {
		return err
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return fmt.Errorf("postmaster.pid: %w", err)
	}
	pids := append(children(postmaster), postmaster)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("process %d survived SIGKILL", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// children returns the processes whose parent is pid.
func children(pid int) []int {
	var out []int
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		// After the command name in parentheses: state, then the parent.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			if child, err := strconv.Atoi(filepath.Base(filepath.Dir(d))); err == nil {
				out = append(out, child)
			}
		}
	}
	return out
}

// alive reports whether pid is a process that has not exited (a zombie
// has).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}
