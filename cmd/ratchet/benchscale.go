package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oklog/ulid/v2"

	"github.com/ratchet-run/ratchet/internal/bench"
	"github.com/ratchet-run/ratchet/internal/fakes"
)

type benchScaleCmd struct {
	dbFlags
	Processes   []int         `name:"processes" default:"1,2,4" help:"Numbers of ratchet serve processes measured, each with its worker."`
	Concurrency int           `name:"concurrency" default:"64" help:"HTTP callers posting payments at once, spread over the processes."`
	Duration    time.Duration `name:"duration" default:"30s" help:"Length of each measurement."`
	WarmUp      time.Duration `name:"warm-up" default:"5s" help:"Unmeasured load after the processes start."`
	MaxInline   int           `name:"max-inline" default:"64" help:"--max-inline of each process: at least the callers a process gets, or some are answered 202 and the benchmark stops."`
}

// Run starts ratchet serve processes against a scratch database, with the
// example gateway and mail service in this process, and posts payments to
// them over HTTP: runs/s, latency, and where the time went (commits, WAL,
// connections, and the CPU of Postgres, the serve processes and this one
// when the server is on this host).
func (c *benchScaleCmd) Run(e *env) error {
	if len(c.Processes) == 0 || c.Concurrency < 1 || c.Duration <= 0 || c.WarmUp < 0 || c.MaxInline < 1 {
		return fmt.Errorf("--processes, --concurrency, --duration and --max-inline must be positive, --warm-up not negative")
	}
	for _, n := range c.Processes {
		if n < 1 || n > 32 {
			return fmt.Errorf("--processes %d: want 1..32", n)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	pool, _, done, err := scratchDatabase(e, &c.dbFlags, 4)
	if err != nil {
		return err
	}
	defer done()
	dbURL, err := withDatabase(c.DatabaseURL, pool.Config().ConnConfig.Database)
	if err != nil {
		return err
	}
	gateway, mail := fakes.NewGateway(nil), fakes.NewMail(nil)
	gwURL, stopGw, err := listen(e.ctx, gateway)
	if err != nil {
		return err
	}
	defer stopGw()
	mailURL, stopMail, err := listen(e.ctx, mail)
	if err != nil {
		return err
	}
	defer stopMail()

	local := isLocal(pool.Config().ConnConfig.Host)
	perProcess := workerConfig(appFlags{MaxInline: c.MaxInline}, true).Connections()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.Concurrency, MaxConnsPerHost: c.Concurrency}}
	fmt.Fprintf(e.stdout, "payments over HTTP (create, charge through the gateway, post the ledger, enqueue a receipt), %d callers, %s a measurement after %s of warm-up;\n"+
		"runs/s counts the payments that succeeded within it; latency is the HTTP answer's (a 202 leaves the run to a worker);\n"+
		"each process: ratchet serve with its worker, --max-inline %d, a pool of up to %d connections (cut to its share of the server's free ones);\n"+
		"connections is the most the database had open at once.\n"+
		"CPU is the share of one core, over the measurement; Postgres's is that of the scratch database's backends, sampled every 200 ms\n"+
		"(a lower bound: a backend's last moments before it exits are missed; other clients of the server and its shared processes are not counted;\n"+
		"\"-\": Postgres is not on this host, or its processes are not visible from here).\n",
		c.Concurrency, c.Duration, c.WarmUp, c.MaxInline, perProcess)
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "processes\tpool each\truns/s\tp50 ms\tp99 ms\tanswered 202\tcommits/run\tWAL bytes/run\tWAL flushes/s\tconnections\tCPU postgres\tCPU serve\tCPU bench\t")
	// The server's connections are shared by every process: each pool is
	// cut to its share of what is free, else the processes' pools together
	// exceed max_connections and requests fail with 503.
	var free int
	if err := pool.QueryRow(e.ctx, `
		SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int
			- (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend') - 4`).Scan(&free); err != nil {
		return err
	}
	for _, n := range c.Processes {
		conns := min(perProcess, free/n)
		fmt.Fprintf(e.stderr, "starting %d process(es), pools of %d connections\n", n, conns)
		procs, err := startServes(e.ctx, self, n, withPoolSize(dbURL, conns), "--gateway-url", gwURL, "--mail-url", mailURL,
			"--max-inline", strconv.Itoa(c.MaxInline))
		if err != nil {
			return err
		}
		row, err := c.measure(e, pool, client, procs, local)
		stopServes(procs)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t\n", n, conns, row)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "gateway: %d charges; mail: %d receipts\n", gateway.Stats().Charges, mail.Stats().Deliveries)
	return nil
}

// measure warms n processes up and measures them; it returns the table's
// cells but the first.
func (c *benchScaleCmd) measure(e *env, pool *pgxpool.Pool, client *http.Client, procs []*serveProc, local bool) (string, error) {
	tag := strings.ToLower(ulid.Make().String()[16:])
	var deferred atomic.Int64 // answered 202: accepted, left to a worker
	post := func(ctx context.Context, i int) error {
		p := procs[i%len(procs)]
		body := fmt.Sprintf(`{"amount": %d, "currency": "usd", "customer": "cus_%d", "email": "c%d@example.com"}`, 100+i%9000, i%1000, i)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.base+"/v1/workflows/payment/runs", strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Idempotency-Key", fmt.Sprintf("scale-%s-%d", tag, i))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusCreated:
		case http.StatusAccepted:
			deferred.Add(1)
		default:
			return fmt.Errorf("payment %d: %d %s", i, resp.StatusCode, b)
		}
		return nil
	}
	if c.WarmUp > 0 {
		if _, err := bench.Drive(e.ctx, c.Concurrency, 0, c.WarmUp, post); err != nil {
			return "", err
		}
	}
	tag = strings.ToLower(ulid.Make().String()[16:])
	deferred.Store(0)
	before, err := readServer(e.ctx, pool)
	if err != nil {
		return "", err
	}
	cpuBefore := cpuOf(procs)
	backends := newBackendSampler(local, before.at)
	sampled := make(chan struct{})
	sampling, stopSampling := context.WithCancel(e.ctx)
	go func() {
		defer close(sampled)
		backends.run(sampling, pool, 200*time.Millisecond)
	}()
	res, err := bench.Drive(e.ctx, c.Concurrency, 0, c.Duration, post)
	stopSampling()
	<-sampled
	if err != nil {
		return "", err
	}
	cpu := cpuOf(procs).sub(cpuBefore)
	after, err := readServer(e.ctx, pool)
	if err != nil {
		return "", err
	}
	// Runs/s counts the payments that succeeded within the measurement,
	// by the server's clock, however they were executed.
	var succeeded int64
	if err := pool.QueryRow(e.ctx, `SELECT count(*) FROM ratchet.runs WHERE status = 'succeeded' AND finished_at > $1 AND finished_at <= $2`,
		before.at, after.at).Scan(&succeeded); err != nil {
		return "", err
	}
	runs := float64(succeeded)
	elapsed := after.at.Sub(before.at).Seconds()
	share := func(ticks int64) string {
		return fmt.Sprintf("%.0f%%", float64(ticks)/100/res.Elapsed.Seconds()*100)
	}
	pgCPU := "-"
	if ticks, ok := backends.ticks(); ok {
		pgCPU = share(ticks)
	}
	return fmt.Sprintf("%.0f\t%.1f\t%.1f\t%.1f%%\t%.2f\t%.0f\t%.0f\t%d\t%s\t%s\t%s",
		runs/elapsed, float64(res.P50.Microseconds())/1000, float64(res.P99.Microseconds())/1000,
		100*float64(deferred.Load())/float64(res.Ops),
		float64(after.commits-before.commits)/runs, float64(after.wal-before.wal)/runs,
		float64(after.syncs-before.syncs)/elapsed, backends.most,
		pgCPU, share(cpu.serve), share(cpu.self)), nil
}

// serveProc is a ratchet serve process the benchmark started.
type serveProc struct {
	cmd  *exec.Cmd
	base string // its API's base URL
	// readOnly counts the connections its pool dropped for meeting a
	// read-only server (its log's readOnlyDropped records).
	readOnly lineCounter
}

// lineCounter counts the lines written to it that contain want.
type lineCounter struct {
	want    string
	mu      sync.Mutex
	partial []byte
	n       int
}

func (c *lineCounter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.partial = append(c.partial, p...)
	for {
		i := bytes.IndexByte(c.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		if bytes.Contains(c.partial[:i], []byte(c.want)) {
			c.n++
		}
		c.partial = c.partial[i+1:]
	}
}

// Count is how many lines so far contained want.
func (c *lineCounter) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// startServes starts n ratchet serve processes with args and waits until
// each listens.
func startServes(ctx context.Context, self string, n int, dbURL string, args ...string) ([]*serveProc, error) {
	var procs []*serveProc
	for range n {
		cmd := exec.CommandContext(ctx, self, append([]string{"serve", "--database-url", dbURL, "--addr", "127.0.0.1:0"}, args...)...)
		cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none", "OTEL_METRICS_EXPORTER=none", "OTEL_LOGS_EXPORTER=none")
		p := &serveProc{cmd: cmd, readOnly: lineCounter{want: readOnlyDropped}}
		cmd.Stderr = &p.readOnly
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			stopServes(procs)
			return nil, err
		}
		procs = append(procs, p)
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if addr, ok := strings.CutPrefix(lines.Text(), "ratchet API listening on "); ok {
				p.base, _, _ = strings.Cut(addr, " ")
				break
			}
		}
		if p.base == "" {
			stopServes(procs)
			return nil, fmt.Errorf("ratchet serve exited before listening: %v", cmd.Wait())
		}
		go func() { _, _ = io.Copy(io.Discard, stdout) }()
	}
	return procs, nil
}

// stopServes stops the processes gracefully and waits for them.
func stopServes(procs []*serveProc) {
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		_ = p.cmd.Wait()
	}
}

// listen serves h on a port of its own until stop.
func listen(ctx context.Context, h http.Handler) (base string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// withPoolSize returns the connection string s with pool_max_conns n.
func withPoolSize(s string, n int) string {
	if u, err := url.Parse(s); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("pool_max_conns", strconv.Itoa(n))
		u.RawQuery = q.Encode()
		return u.String()
	}
	return s + " pool_max_conns=" + strconv.Itoa(n)
}

// withDatabase returns the connection string s naming database instead.
func withDatabase(s, database string) (string, error) {
	if strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") {
		u, err := url.Parse(s)
		if err != nil {
			return "", err
		}
		u.Path = "/" + database
		return u.String(), nil
	}
	return s + " dbname=" + database, nil
}

// serverStats are the server's clock and counters the benchmark reads.
type serverStats struct {
	at                  time.Time
	commits, wal, syncs int64
}

func readServer(ctx context.Context, pool *pgxpool.Pool) (serverStats, error) {
	var s serverStats
	err := pool.QueryRow(ctx, `
		SELECT clock_timestamp(), (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
			pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,
			(SELECT wal_sync FROM pg_stat_wal)`).Scan(&s.at, &s.commits, &s.wal, &s.syncs)
	if err != nil {
		return s, fmt.Errorf("read the server's statistics: %w", err)
	}
	return s, nil
}

// cpuTicks are CPU times in clock ticks (USER_HZ, 100 a second on Linux).
type cpuTicks struct{ serve, self int64 }

func (a cpuTicks) sub(b cpuTicks) cpuTicks {
	return cpuTicks{a.serve - b.serve, a.self - b.self}
}

// cpuOf reads the CPU time of procs and of this process. A process that
// cannot be read counts nothing, so the difference of two readings may
// undercount, never go negative: the serve processes outlive the
// measurement.
func cpuOf(procs []*serveProc) cpuTicks {
	var t cpuTicks
	for _, p := range procs {
		ticks, _ := procTicks("/proc/" + strconv.Itoa(p.cmd.Process.Pid))
		t.serve += ticks
	}
	t.self, _ = procTicks("/proc/self")
	return t
}

// isLocal reports whether host is this machine.
func isLocal(host string) bool {
	return host == "localhost" || strings.HasPrefix(host, "/") || net.ParseIP(host).IsLoopback()
}
