// Package pgboot starts a throwaway Postgres cluster from the Postgres
// binaries installed on the machine, for `ratchet dev` when no server
// answers. The cluster lives in a temporary directory, listens on
// 127.0.0.1 at a free port, trusts local connections, and is deleted by
// Stop. Run as root, the server runs as the "postgres" user, since Postgres
// refuses to run as root.
package pgboot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// Cluster is a running throwaway cluster.
type Cluster struct {
	// URL connects to its postgres database as the postgres superuser.
	URL string
	// Bin is the directory of the binaries that run it.
	Bin string
	// Dir holds the cluster's data, socket and log; Stop deletes it.
	Dir     string
	cred    *syscall.Credential
	data    string // its data directory
	stopped bool
}

// FindBin returns the directory holding initdb and pg_ctl: the newest
// version under /usr/lib/postgresql, else the one on PATH.
func FindBin() (string, error) {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool { return version(matches[i]) > version(matches[j]) })
	for _, m := range matches {
		if _, err := os.Stat(filepath.Join(filepath.Dir(m), "pg_ctl")); err == nil {
			return filepath.Dir(m), nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no Postgres server binaries (initdb, pg_ctl) found: install Postgres, or set DATABASE_URL")
}

func version(initdb string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return v
}

// Start initialises and starts a cluster. Stop it when done.
func Start(ctx context.Context) (*Cluster, error) {
	bin, err := FindBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ratchet-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Bin: bin, Dir: dir}
	if os.Geteuid() == 0 {
		if c.cred, err = postgresUser(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	if err := c.run(ctx, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", port, dir)
	if err := c.run(ctx, "pg_ctl", "-D", data, "-l", filepath.Join(dir, "server.log"), "-o", opts, "-w", "-t", "60", "start"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	c.data = data
	return c, nil
}

// Stop stops the server and deletes the cluster.
func (c *Cluster) Stop() error {
	return errors.Join(c.stop(), os.RemoveAll(c.Dir))
}

// stop stops the server.
func (c *Cluster) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.run(ctx, "pg_ctl", "-D", c.data, "-m", "fast", "-w", "stop")
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.Bin, name), args...)
	cmd.Dir = c.Dir
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New("running as root, a throwaway cluster needs a \"postgres\" user to run the server as")
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
