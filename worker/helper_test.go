package worker_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/testproc"
	"github.com/ratchet-run/ratchet/steps"
	"github.com/ratchet-run/ratchet/worker"
)

// The tests start this test binary again as Ratchet processes: a worker, or
// an API-like process that executes a run inline. They talk over stdin and
// stdout in lines:
//
//	out: READY <lease owner id> | AT <point> <key> | DONE <key> <status or error> | STOPPED
//	in:  go (release one paused point) | start <key> [pause point]
//
// ORDER_VERSIONS=1,2 makes the process a new build: "order" v1 draining
// beside v2.
func TestMain(m *testing.M) { testproc.Main(m, helperMain) }

// startProc starts a helper process with env added and waits for READY.
func startProc(t *testing.T, env ...string) *testproc.Proc {
	t.Helper()
	return testproc.Start(t, "READY", env...)
}

// order is the input of the three-phase test workflow.
type order struct {
	Key      string `json:"key"`
	Amount   int64  `json:"amount"`
	Customer string `json:"customer"`
	// Nap, when positive, sleeps the run this long between its charge and
	// its posting (phase "napped").
	Nap time.Duration `json:"nap,omitempty"`
}

func orderInput(key string) []byte {
	b, _ := json.Marshal(order{Key: key, Amount: 1299, Customer: "cus_123"})
	return b
}

func napInput(key string, nap time.Duration) []byte {
	b, _ := json.Marshal(order{Key: key, Amount: 1299, Customer: "cus_123", Nap: nap})
	return b
}

// pauser stops a workflow at named points until told to go on: at the
// points of PAUSE_AT in every run, and at a run's own point given with its
// start command.
type pauser struct {
	mu     sync.Mutex
	points map[string]bool   // every run
	perKey map[string]string // key → point
	out    func(string)
	goOn   chan struct{}
}

func (p *pauser) pauseAt(key, point string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.perKey[key] = point
}

func (p *pauser) at(ctx context.Context, point, key string) error {
	p.mu.Lock()
	pause := p.points[point] || p.perKey[key] == point
	p.mu.Unlock()
	if !pause {
		return nil
	}
	p.out(fmt.Sprintf("AT %s %s", point, key))
	select {
	case <-p.goOn:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// addOrderFlow registers "order": reserve (atomic), charge (external step),
// post (atomic). Atomic phases insert a row into effects, so a phase run
// twice shows as two rows.
func addOrderFlow(workflows *engine.Workflows, gatewayURL string, p *pauser) error {
	return addOrderVersion(workflows, gatewayURL, p, nil)
}

// addOrderVersion registers "order" with opts: version 2 checks the order
// (atomic phase "checked") between its reservation and its charge.
func addOrderVersion(workflows *engine.Workflows, gatewayURL string, p *pauser, opts *engine.WorkflowOpts) error {
	version := 1
	if opts != nil && opts.Version > 0 {
		version = opts.Version
	}
	gw := &fakes.GatewayClient{BaseURL: gatewayURL, HTTP: steps.NewClient(nil)}
	effect := func(ctx context.Context, tx pgx.Tx, key, phase string) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (order_key, phase, pid) VALUES ($1, $2, $3)`, key, phase, os.Getpid())
		return err
	}
	_, err := engine.Register(workflows, "order", func(ctx context.Context, in order) (fakes.Charge, error) {
		var none fakes.Charge
		if _, err := engine.Atomic(ctx, "reserved", func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			if err := effect(ctx, tx, in.Key, "reserved"); err != nil {
				return struct{}{}, err
			}
			return struct{}{}, p.at(ctx, "reserved.before-commit", in.Key)
		}, nil); err != nil {
			return none, err
		}
		if err := p.at(ctx, "reserved.after-commit", in.Key); err != nil {
			return none, err
		}
		if version >= 2 {
			if _, err := engine.Atomic(ctx, "checked", func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
				return struct{}{}, effect(ctx, tx, in.Key, "checked")
			}, nil); err != nil {
				return none, err
			}
			if err := p.at(ctx, "checked.after-commit", in.Key); err != nil {
				return none, err
			}
		}
		ch, err := engine.Step(ctx, "charged", func(ctx context.Context, _ steps.Key) (fakes.Charge, error) {
			ch, err := gw.Charge(ctx, fakes.ChargeRequest{Amount: in.Amount, Currency: "usd", Customer: in.Customer})
			if err == nil {
				err = p.at(ctx, "charged.mid", in.Key) // charged, not yet committed
			}
			return ch, err
		}, nil)
		if err != nil {
			return none, err
		}
		if err := p.at(ctx, "charged.after-commit", in.Key); err != nil {
			return none, err
		}
		if in.Nap > 0 {
			if err := engine.Sleep(ctx, "napped", in.Nap); err != nil {
				return none, err
			}
			if err := p.at(ctx, "napped.after-wake", in.Key); err != nil {
				return none, err
			}
		}
		if _, err := engine.Atomic(ctx, "posted", func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			if err := effect(ctx, tx, in.Key, "posted"); err != nil {
				return struct{}{}, err
			}
			return struct{}{}, p.at(ctx, "posted.before-commit", in.Key)
		}, nil); err != nil {
			return none, err
		}
		return ch, p.at(ctx, "posted.after-commit", in.Key)
	}, opts)
	return err
}

// addApprovalFlow registers "approval": a phase, an Await of "approved"
// matched by the order key, and a phase; atomic phases insert effects.
func addApprovalFlow(workflows *engine.Workflows) error {
	effect := func(ctx context.Context, tx pgx.Tx, key, phase string) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (order_key, phase, pid) VALUES ($1, $2, $3)`, key, phase, os.Getpid())
		return err
	}
	_, err := engine.Register(workflows, "approval", func(ctx context.Context, in order) (string, error) {
		if _, err := engine.Atomic(ctx, "reserved", func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			return struct{}{}, effect(ctx, tx, in.Key, "reserved")
		}, nil); err != nil {
			return "", err
		}
		by, err := engine.Await[struct{ By string }](ctx, "approved", &engine.AwaitOpts{CorrelationKey: in.Key})
		if err != nil {
			return "", err
		}
		_, err = engine.Atomic(ctx, "posted", func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			return struct{}{}, effect(ctx, tx, in.Key, "posted")
		}, nil)
		return by.By, err
	}, nil)
	return err
}

func durationEnv(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}

func helperMain() error {
	ctx := context.Background()
	var outMu sync.Mutex
	out := func(line string) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Println(line)
	}
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	cfg.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	p := &pauser{points: map[string]bool{}, perKey: map[string]string{}, out: out, goOn: make(chan struct{})}
	for _, point := range strings.Split(os.Getenv("PAUSE_AT"), ",") {
		if point != "" {
			p.points[point] = true
		}
	}
	workflows := engine.NewWorkflows()
	switch os.Getenv("ORDER_VERSIONS") {
	case "", "1":
		if err := addOrderFlow(workflows, os.Getenv("GATEWAY_URL"), p); err != nil {
			return err
		}
	case "1,2": // the new build: v1 drains, new runs start on v2
		if err := addOrderVersion(workflows, os.Getenv("GATEWAY_URL"), p, &engine.WorkflowOpts{Version: 1, Drain: true}); err != nil {
			return err
		}
		if err := addOrderVersion(workflows, os.Getenv("GATEWAY_URL"), p, &engine.WorkflowOpts{Version: 2}); err != nil {
			return err
		}
	default:
		return fmt.Errorf("ORDER_VERSIONS %q: want 1 or 1,2", os.Getenv("ORDER_VERSIONS"))
	}
	if err := addApprovalFlow(workflows); err != nil {
		return err
	}
	staleAfter := durationEnv("STALE_AFTER", 2*time.Second)
	logger := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	// The worker as a service deploys it: the engine's heartbeat and the
	// recoverer's poll at their defaults.
	w, err := worker.New(pool, &worker.Config{
		Engine: engine.Config{
			Workflows: workflows, StaleAfter: staleAfter,
			StepPolicy: steps.Policy{InitialInterval: 10 * time.Millisecond, MaxAttempts: 3},
			Retry:      engine.RetryPolicy{InitialInterval: 100 * time.Millisecond, Multiplier: 1, Jitter: -1},
		},
		InsertOnly:    os.Getenv("INSERT_ONLY") != "",
		ShutdownGrace: durationEnv("GRACE", 5*time.Second),
		Logger:        logger,
	})
	if err != nil {
		return err
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	start := func(key string) {
		res, err := w.Engine().Start(ctx, engine.StartParams{Workflow: "order", IdempotencyKey: key, Input: orderInput(key), StartOpts: engine.StartOpts{Traceparent: os.Getenv("TRACEPARENT")}})
		switch {
		case err != nil:
			out(fmt.Sprintf("DONE %s error: %v", key, err))
		default:
			out(fmt.Sprintf("DONE %s %s", key, res.Run.Status))
		}
	}
	if key := os.Getenv("RUN_KEY"); key != "" {
		go start(key)
	}
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			switch cmd, arg, _ := strings.Cut(sc.Text(), " "); cmd {
			case "go": // to a paused point, if one is (still) paused
				select {
				case p.goOn <- struct{}{}:
				default:
				}
			case "signal": // signal <event id> <correlation key>: delivered in a transaction paused before its commit
				event, key, _ := strings.Cut(arg, " ")
				go func() {
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						if _, err := w.Engine().SignalTx(ctx, tx, engine.SignalParams{Name: "approved", EventID: event, CorrelationKey: key, Payload: []byte(`{"by":"` + event + `"}`)}); err != nil {
							return err
						}
						return p.at(ctx, "signal.before-commit", key)
					})
					if err != nil {
						out(fmt.Sprintf("SIGNALLED %s error: %v", event, err))
						return
					}
					out("SIGNALLED " + event)
				}()
			case "start": // start <key> [point]
				key, point, _ := strings.Cut(arg, " ")
				if point != "" {
					p.pauseAt(key, point)
				}
				go start(key)
			}
		}
	}()
	out("READY " + w.Engine().ID())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := w.Stop(stopCtx); err != nil {
		return err
	}
	out("STOPPED")
	return nil
}
