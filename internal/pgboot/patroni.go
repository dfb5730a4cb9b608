package pgboot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Patroni is a throwaway two-node Patroni cluster on this machine, for
// the failover chaos command under a real HA manager: one etcd as its
// store, and two Patroni agents, each running a Postgres it initialises
// or clones and promotes. Patroni, not this package, decides who leads.
type Patroni struct {
	// URL connects to whichever node accepts writes (a multi-host
	// connection string with target_session_attrs=read-write).
	URL string
	// Sync says whether Patroni runs in synchronous_mode: a commit waits
	// for the standby, and only a synchronous standby is promoted.
	Sync     bool
	dir      string
	cred     *syscall.Credential
	etcd     *exec.Cmd
	nodes    [2]*patroniNode
	killedAt time.Time
}

type patroniNode struct {
	name  string
	api   string // its REST API's base URL
	agent *exec.Cmd
	pg    *Cluster // its Postgres: URL and data directory
	dead  bool
}

// patroniTTL is the leader key's time to live, in seconds: a leader whose
// agent dies is replaced this long after its last renewal.
const patroniTTL = 10

// PatroniInstalled reports why a Patroni cluster cannot be started here,
// or nil: the patroni and etcd commands and Postgres's binaries.
func PatroniInstalled() error {
	for _, cmd := range []string{"patroni", "etcd"} {
		if _, err := exec.LookPath(cmd); err != nil {
			return fmt.Errorf("%s is not installed (Debian: apt-get install patroni etcd-server)", cmd)
		}
	}
	_, err := FindBin()
	return err
}

// StartPatroni starts etcd and two Patroni nodes, and returns once one
// leads and the other streams from it (synchronously with sync).
func StartPatroni(ctx context.Context, sync bool) (*Patroni, error) {
	if err := PatroniInstalled(); err != nil {
		return nil, err
	}
	bin, _ := FindBin()
	dir, err := os.MkdirTemp("", "ratchet-patroni-")
	if err != nil {
		return nil, err
	}
	p := &Patroni{Sync: sync, dir: dir}
	fail := func(err error) (*Patroni, error) {
		_ = p.Stop()
		return nil, err
	}
	if os.Geteuid() == 0 {
		if p.cred, err = postgresUser(); err != nil {
			return fail(err)
		}
		if err := os.Chown(dir, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			return fail(err)
		}
	}
	ports, err := freePorts(6)
	if err != nil {
		return fail(err)
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	if p.etcd, err = p.spawn("etcd", "etcd", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		"--initial-cluster", fmt.Sprintf("default=http://127.0.0.1:%d", ports[1])); err != nil {
		return fail(err)
	}
	for i := range p.nodes {
		name := fmt.Sprintf("n%d", i+1)
		pgPort, apiPort := ports[2+2*i], ports[3+2*i]
		n := &patroniNode{name: name, api: fmt.Sprintf("http://127.0.0.1:%d", apiPort), pg: &Cluster{Bin: bin, Dir: dir, cred: p.cred, data: filepath.Join(dir, name),
			URL: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", pgPort)}}
		config := filepath.Join(dir, name+".yml")
		if err := os.WriteFile(config, []byte(patroniConfig(name, ports[0], apiPort, pgPort, dir, bin, sync)), 0o644); err != nil {
			return fail(err)
		}
		if n.agent, err = p.spawn(name, "patroni", config); err != nil {
			return fail(err)
		}
		p.nodes[i] = n
		if i == 0 {
			// The first node initialises the cluster; the second clones
			// it once it leads.
			if _, err := p.leader(ctx, 60*time.Second); err != nil {
				return fail(err)
			}
		}
	}
	lead, err := p.leader(ctx, 30*time.Second)
	if err != nil {
		return fail(err)
	}
	if err := awaitStreaming(ctx, lead.pg.URL, sync); err != nil {
		return fail(err)
	}
	// Postgres streaming synchronously is not yet Patroni's word: in
	// synchronous_mode it promotes, and grants a switchover to, only the
	// member it has recorded as sync_standby, a loop or so later.
	if _, err := p.awaitCandidate(ctx, lead, p.other(lead)); err != nil {
		return fail(err)
	}
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		ports[2], ports[4])
	return p, nil
}

// patroniConfig is node name's configuration: etcd at etcdPort, its REST
// API at apiPort, its Postgres at pgPort, trusting local connections.
func patroniConfig(name string, etcdPort, apiPort, pgPort int, dir, bin string, sync bool) string {
	return fmt.Sprintf(`scope: ratchet
name: %[1]s
restapi:
  listen: 127.0.0.1:%[3]d
  connect_address: 127.0.0.1:%[3]d
etcd3:
  hosts: 127.0.0.1:%[2]d
bootstrap:
  dcs:
    ttl: %[8]d
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 1073741824
    synchronous_mode: %[7]t
    postgresql:
      use_pg_rewind: false
      parameters:
        fsync: "off"
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:%[4]d
  connect_address: 127.0.0.1:%[4]d
  data_dir: %[5]s/%[1]s
  bin_dir: %[6]s
  pgpass: %[5]s/%[1]s.pgpass
  authentication:
    superuser: {username: postgres}
    replication: {username: postgres}
  parameters:
    unix_socket_directories: %[5]s
`, name, etcdPort, apiPort, pgPort, dir, bin, sync, patroniTTL)
}

// spawn starts a long-running process of the cluster, as the postgres
// user when root, logging to the cluster's directory.
func (p *Patroni) spawn(logName, name string, args ...string) (*exec.Cmd, error) {
	log, err := os.Create(filepath.Join(p.dir, logName+".log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(name, args...)
	cmd.Dir = p.dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { _ = cmd.Wait() }() // reaped, so that a killed agent is gone, not a zombie
	return cmd, nil
}

// leader waits until a living node's Postgres accepts writes and
// returns it.
func (p *Patroni) leader(ctx context.Context, within time.Duration) (*patroniNode, error) {
	var lead *patroniNode
	err := until(ctx, within, func() bool {
		for _, n := range p.nodes {
			var recovering bool
			if n != nil && !n.dead && query1(ctx, n.pg.URL, `SELECT pg_is_in_recovery()`, nil, &recovering) == nil && !recovering {
				lead = n
				return true
			}
		}
		return false
	})
	if err != nil {
		return nil, fmt.Errorf("no Patroni node leads (logs in %s): %w", p.dir, err)
	}
	return lead, nil
}

// Fail kills the leading node — its Patroni agent and its Postgres with
// every process (SIGKILL: a machine lost, no shutdown, no last WAL sent) —
// and waits until Patroni has promoted the other, once the dead leader's
// key has expired. Killing the postmaster alone would not do: the agent
// would restart it in place.
func (p *Patroni) Fail(ctx context.Context) error {
	lead, err := p.leader(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	// Patroni promotes only a standby it reports able to take the lead
	// (in synchronous_mode, the one it has recorded as sync_standby): a
	// kill before that would leave the cluster leaderless.
	if _, err := p.awaitCandidate(ctx, lead, p.other(lead)); err != nil {
		return err
	}
	_ = syscall.Kill(-lead.agent.Process.Pid, syscall.SIGKILL)
	if err := lead.pg.kill(); err != nil {
		return err
	}
	p.killedAt = time.Now()
	lead.dead = true
	_, err = p.leader(ctx, 4*patroniTTL*time.Second)
	return err
}

// patroniReady bounds how long Patroni has to report a standby able to
// take the lead: a few of its loops (loop_wait 1 s) once the standby
// streams, longer after a failover while the old leader rejoins.
const patroniReady = 60 * time.Second

// clusterView is Patroni's GET /cluster: the members as its store (etcd)
// records them, read afresh.
type clusterView struct {
	Members []clusterMember `json:"members"`
	Pause   bool            `json:"pause"`
}

type clusterMember struct {
	Name string `json:"name"`
	// Role is leader, sync_standby (synchronous_mode's chosen standby) or
	// replica.
	Role string `json:"role"`
	// State is the member's Postgres as its agent sees it: running
	// (Patroni 3.0.2's word for a healthy replica too), streaming (later
	// releases'), starting, stopped, ...
	State    string `json:"state"`
	Timeline int    `json:"timeline"`
	// Lag is bytes of WAL behind the leader, or "unknown"; absent for the
	// leader.
	Lag json.RawMessage `json:"lag"`
}

func (v clusterView) String() string {
	if len(v.Members) == 0 {
		return "no members"
	}
	var b strings.Builder
	for i, m := range v.Members {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s %s", m.Name, m.Role, m.State)
		if m.Timeline > 0 {
			fmt.Fprintf(&b, " timeline %d", m.Timeline)
		}
		if m.Lag != nil {
			fmt.Fprintf(&b, " lag %s", m.Lag)
		}
	}
	if v.Pause {
		b.WriteString(" (paused)")
	}
	return b.String()
}

// canTakeLead says why Patroni, as v reports the cluster, would not hand
// the lead from lead to next, or "" when it would: lead is the leader,
// next a replica whose Postgres runs with a known lag and, in
// synchronous_mode, the recorded sync_standby (Patroni's precondition for
// a switchover to it, and for promoting it when the leader dies).
func (v clusterView) canTakeLead(lead, next string, sync bool) string {
	var l, n *clusterMember
	for i := range v.Members {
		switch v.Members[i].Name {
		case lead:
			l = &v.Members[i]
		case next:
			n = &v.Members[i]
		}
	}
	standby := n != nil && (n.Role == "sync_standby" || !sync && n.Role == "replica")
	switch {
	case v.Pause:
		return "the cluster is paused"
	case l == nil || l.Role != "leader":
		return lead + " is not the leader"
	case n == nil:
		return next + " is not a member"
	case !standby && sync:
		return fmt.Sprintf("%s is %s, not sync_standby", next, n.Role)
	case !standby:
		return fmt.Sprintf("%s is %s, not a replica", next, n.Role)
	case n.State != "running" && n.State != "streaming":
		return fmt.Sprintf("%s is %s", next, n.State)
	case n.Lag == nil || string(n.Lag) == `"unknown"`:
		return next + "'s lag is unknown"
	}
	return ""
}

// clusterView reads GET /cluster from node n's agent.
func (p *Patroni) clusterView(ctx context.Context, n *patroniNode) (clusterView, error) {
	var v clusterView
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.api+"/cluster", nil)
	if err != nil {
		return v, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("GET /cluster: %s", resp.Status)
	}
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

// awaitCandidate waits, up to patroniReady, until the leader's agent
// reports next able to take the lead from lead (canTakeLead), and returns
// that view. Otherwise the error says what Patroni last reported.
func (p *Patroni) awaitCandidate(ctx context.Context, lead, next *patroniNode) (clusterView, error) {
	var (
		view clusterView
		why  string
		last error
	)
	err := until(ctx, patroniReady, func() bool {
		if view, last = p.clusterView(ctx, lead); last != nil {
			return false
		}
		why = view.canTakeLead(lead.name, next.name, p.Sync)
		return why == ""
	})
	if err == nil {
		return view, nil
	}
	if last != nil {
		why = last.Error()
	}
	return view, fmt.Errorf("pgboot: Patroni does not report %s able to take the lead from %s: %s; Patroni reports %s (logs in %s): %w",
		next.name, lead.name, why, view, p.dir, err)
}

// post posts a JSON body and returns the answer's status and body.
func post(ctx context.Context, url, body string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(answer)), err
}

// KilledAt is when Fail's kill had completed, or when Switchover asked.
func (p *Patroni) KilledAt() time.Time { return p.killedAt }

// Switchover asks Patroni to hand the lead to the standby (POST /switchover
// to the leader's REST API), as an operator does for maintenance: Patroni
// stops the leader's Postgres cleanly, promotes the standby, and starts the
// old leader again as a standby of the new one — a server that answers,
// read-only, where the primary was. It asks only once Patroni reports the
// standby able to take the lead (awaitCandidate), and returns once the new
// leader accepts writes.
func (p *Patroni) Switchover(ctx context.Context) error {
	lead, err := p.leader(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	next := p.other(lead)
	body := fmt.Sprintf(`{"leader": %q, "candidate": %q}`, lead.name, next.name)
	deadline := time.Now().Add(patroniReady)
	for {
		view, err := p.awaitCandidate(ctx, lead, next)
		if err != nil {
			return err
		}
		p.killedAt = time.Now()
		status, answer, err := post(ctx, lead.api+"/switchover", body)
		if err != nil {
			return fmt.Errorf("pgboot: ask Patroni to switch over: %w", err)
		}
		if status == http.StatusOK {
			break
		}
		// 412 is Patroni's precondition, judged from its own view of the
		// cluster, which the view just read may be a moment ahead of: ask
		// again once it reports the candidate ready, within the bound.
		// Anything else (503: the switchover failed or its outcome is
		// unknown) is not a state to wait out.
		if status != http.StatusPreconditionFailed || time.Now().After(deadline) {
			if now, err := p.clusterView(ctx, lead); err == nil {
				view = now
			}
			return fmt.Errorf("pgboot: Patroni refused the switchover from %s to %s (%d %s): %s; Patroni reports %s",
				lead.name, next.name, status, http.StatusText(status), answer, view)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	err = until(ctx, 4*patroniTTL*time.Second, func() bool {
		var recovering bool
		return query1(ctx, next.pg.URL, `SELECT pg_is_in_recovery()`, nil, &recovering) == nil && !recovering
	})
	if err != nil {
		view, _ := p.clusterView(ctx, next)
		return fmt.Errorf("pgboot: %s did not take the lead after the switchover (Patroni reports %s; logs in %s): %w", next.name, view, p.dir, err)
	}
	return nil
}

// other is the node that is not n.
func (p *Patroni) other(n *patroniNode) *patroniNode {
	if p.nodes[0] == n {
		return p.nodes[1]
	}
	return p.nodes[0]
}

// Lag is how many bytes of WAL the leader has written that the standby
// has not yet flushed: what a promotion now would lose.
func (p *Patroni) Lag(ctx context.Context) (int64, error) {
	lead, err := p.leader(ctx, 10*time.Second)
	if err != nil {
		return 0, err
	}
	return lagOf(ctx, lead.pg.URL)
}

// Stall stops the leader's WAL sender (SIGSTOP), as a slow or broken link
// would. Fail ends it.
func (p *Patroni) Stall(ctx context.Context) error {
	lead, err := p.leader(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	return stallWALSender(ctx, lead.pg.URL)
}

// Stop kills the agents, their servers and etcd, and deletes the
// cluster's directory.
func (p *Patroni) Stop() error {
	var errs []error
	for _, n := range p.nodes {
		if n == nil || n.dead {
			continue
		}
		_ = syscall.Kill(-n.agent.Process.Pid, syscall.SIGKILL)
		if _, err := os.Stat(filepath.Join(n.pg.data, "postmaster.pid")); err == nil {
			errs = append(errs, n.pg.kill())
		}
	}
	if p.etcd != nil {
		_ = syscall.Kill(-p.etcd.Process.Pid, syscall.SIGKILL)
	}
	return errors.Join(append(errs, os.RemoveAll(p.dir))...)
}

// freePorts returns n distinct free ports.
func freePorts(n int) ([]int, error) {
	seen := map[int]bool{}
	var ports []int
	for len(ports) < n {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		if !seen[port] {
			seen[port] = true
			ports = append(ports, port)
		}
	}
	return ports, nil
}
