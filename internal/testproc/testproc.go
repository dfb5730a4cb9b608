// Package testproc runs a test binary again as a helper process, so that
// crash tests can kill, pause and stop real processes. A package's
// TestMain calls Main with its helper; a test calls Start, then talks to
// the helper over stdin and stdout in lines and sends it signals.
package testproc

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// envHelper marks a process started by Start.
const envHelper = "RATCHET_TESTPROC_HELPER"

// Main runs helper instead of the tests in a process started by Start
// (exiting 1 with its error on stderr, else 0), and the tests otherwise.
func Main(m *testing.M, helper func() error) {
	if os.Getenv(envHelper) != "" {
		if err := helper(); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Proc is a helper process seen from the test.
type Proc struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr syncBuffer
	exited chan struct{}
	err    error

	mu  sync.Mutex
	all []string // every line printed so far
}

// Start starts the helper with env added to this process's environment.
// When ready is not empty it waits for a line starting with it. The
// process is killed, if still running, when the test ends; if the test
// failed, its stderr is logged.
func Start(t testing.TB, ready string, env ...string) *Proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envHelper+"=1"), env...)
	p := &Proc{t: t, cmd: cmd, lines: make(chan string, 1000), exited: make(chan struct{})}
	cmd.Stderr = &p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.all = append(p.all, sc.Text())
			p.mu.Unlock()
			p.lines <- sc.Text()
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("stderr of process %d:\n%s", cmd.Process.Pid, p.Stderr())
		}
	})
	if ready != "" {
		p.Expect(ready)
	}
	return p
}

// Process returns the running process.
func (p *Proc) Process() *os.Process { return p.cmd.Process }

// Stderr returns the end of what the process wrote to stderr.
func (p *Proc) Stderr() string {
	s := p.stderr.String()
	if len(s) > 4000 {
		return "..." + s[len(s)-4000:]
	}
	return s
}

// Expect waits for a line starting with prefix and returns it, skipping
// other lines.
func (p *Proc) Expect(prefix string) string {
	p.t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case line := <-p.lines:
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-p.exited:
			// Every line was queued before exited closed.
			for {
				select {
				case line := <-p.lines:
					if strings.HasPrefix(line, prefix) {
						return line
					}
					continue
				default:
				}
				break
			}
			p.t.Fatalf("process %d exited (%v) waiting for %q; stderr:\n%s", p.cmd.Process.Pid, p.err, prefix, p.Stderr())
		case <-timeout:
			p.t.Fatalf("process %d: timed out waiting for %q", p.cmd.Process.Pid, prefix)
		}
	}
}

// Printed returns the first line printed so far that starts with prefix.
func (p *Proc) Printed(prefix string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.all {
		if strings.HasPrefix(l, prefix) {
			return l, true
		}
	}
	return "", false
}

// AwaitLog waits until the process has written s to stderr. Its stderr is
// copied asynchronously, so a log line written before a stdout line may
// arrive after it.
func (p *Proc) AwaitLog(s string) {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.stderr.String(), s) {
		if time.Now().After(deadline) {
			p.t.Fatalf("process %d never logged %q; stderr:\n%s", p.cmd.Process.Pid, s, p.Stderr())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Send writes a line to the process's stdin.
func (p *Proc) Send(line string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		p.t.Fatal(err)
	}
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
}

// Wait waits for the process to exit and returns how it did.
func (p *Proc) Wait() error {
	p.t.Helper()
	select {
	case <-p.exited:
		return p.err
	case <-time.After(60 * time.Second):
		p.t.Fatalf("process %d did not exit", p.cmd.Process.Pid)
		return nil
	}
}

// Killed reports whether the process died of SIGKILL.
func (p *Proc) Killed() bool {
	select {
	case <-p.exited:
	default:
		return false
	}
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
