package api_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/api"
	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/testdb"
	"github.com/ratchet-run/ratchet/steps"
)

type testBundle struct {
	pool    *pgxpool.Pool
	engine  *engine.Client
	server  *httptest.Server
	handler *api.Handler
	// release unblocks executions of the "slow" workflow.
	release chan struct{}
	// executions counts executions of "echo".
	executions atomic.Int64
	// gateway is the fake gateway of "charge" and "saga".
	gateway *fakes.Gateway
}

type echoIn struct {
	Value string `json:"value"`
}

type payIn struct {
	Customer string `json:"customer"`
	Amount   int    `json:"amount"`
}

var errDeclined = errors.New("your card was declined")

func setup(t testing.TB, cfg *api.Config) *testBundle {
	t.Helper()
	b := &testBundle{release: make(chan struct{})}
	b.pool = testdb.New(t, &testdb.Options{MaxConns: 30})
	_, err := b.pool.Exec(context.Background(), `CREATE TABLE counters (name text PRIMARY KEY, n integer NOT NULL)`)
	require.NoError(t, err)

	workflows := engine.NewWorkflows()
	_, err = engine.Register(workflows, "echo", func(ctx context.Context, in echoIn) (echoIn, error) {
		b.executions.Add(1)
		return engine.Atomic(ctx, "stored", func(ctx context.Context, tx pgx.Tx) (echoIn, error) {
			_, err := tx.Exec(ctx, `INSERT INTO counters VALUES ($1, 1) ON CONFLICT (name) DO UPDATE SET n = counters.n + 1`, in.Value)
			return in, err
		}, nil)
	}, nil)
	require.NoError(t, err)
	_, err = engine.Register(workflows, "slow", func(ctx context.Context, in echoIn) (echoIn, error) {
		return engine.Atomic(ctx, "waited", func(ctx context.Context, _ pgx.Tx) (echoIn, error) {
			select {
			case <-b.release:
				return in, nil
			case <-ctx.Done():
				return in, ctx.Err()
			}
		}, nil)
	}, nil)
	require.NoError(t, err)
	// "serial" is "slow" one run at a time per value.
	_, err = engine.Register(workflows, "serial", func(ctx context.Context, in echoIn) (echoIn, error) {
		return engine.Atomic(ctx, "waited", func(ctx context.Context, _ pgx.Tx) (echoIn, error) {
			select {
			case <-b.release:
				return in, nil
			case <-ctx.Done():
				return in, ctx.Err()
			}
		}, nil)
	}, &engine.WorkflowOpts{Concurrency: &engine.Concurrency{Key: "value", Limit: 1}})
	require.NoError(t, err)
	_, err = engine.Register(workflows, "pay", func(ctx context.Context, in payIn) (payIn, error) {
		if in.Customer == "cus_declined" {
			return in, steps.Permanent("card_declined", errDeclined)
		}
		return in, nil
	}, &engine.WorkflowOpts{SuccessStatus: http.StatusCreated, ErrorStatuses: map[string]int{"card_declined": http.StatusPaymentRequired}})
	require.NoError(t, err)

	_, err = engine.Register(workflows, "approval", func(ctx context.Context, in echoIn) (echoIn, error) {
		return engine.Await[echoIn](ctx, "approved", &engine.AwaitOpts{CorrelationKey: in.Value})
	}, nil)
	require.NoError(t, err)
	// "family" starts an "echo" child and awaits it (no worker here
	// executes the child: the parent stays parked).
	_, err = engine.Register(workflows, "family", func(ctx context.Context, in echoIn) (echoIn, error) {
		id, err := engine.StartChild(ctx, "kid", "echo", echoIn{Value: in.Value + "-kid"}, nil)
		if err != nil {
			return in, err
		}
		return engine.AwaitChild[echoIn](ctx, "kid.done", id)
	}, nil)
	require.NoError(t, err)
	_, err = engine.Register(workflows, "nap", func(ctx context.Context, in echoIn) (echoIn, error) {
		return in, engine.Sleep(ctx, "napped", time.Hour)
	}, nil)
	require.NoError(t, err)

	b.gateway = fakes.NewGateway(nil)
	gw := httptest.NewServer(b.gateway)
	t.Cleanup(gw.Close)
	gwClient := &fakes.GatewayClient{BaseURL: gw.URL, HTTP: steps.NewClient(nil)}
	_, err = engine.Register(workflows, "charge", func(ctx context.Context, in payIn) (fakes.Charge, error) {
		return engine.Step(ctx, "charged", func(ctx context.Context, _ steps.Key) (fakes.Charge, error) {
			return gwClient.Charge(ctx, fakes.ChargeRequest{Amount: int64(in.Amount), Currency: "usd", Customer: in.Customer})
		}, nil)
	}, nil)
	require.NoError(t, err)

	// saga charges, refunding on a failure before the ledger (its pivot):
	// customer cus_closed has the ledger refuse; amount 9 awaits approval
	// before the ledger, amount 7 awaits shipping after it.
	_, err = engine.Register(workflows, "saga", func(ctx context.Context, in payIn) (string, error) {
		ch, err := engine.Step(ctx, "charged", func(ctx context.Context, _ steps.Key) (fakes.Charge, error) {
			return gwClient.Charge(ctx, fakes.ChargeRequest{Amount: int64(in.Amount), Currency: "usd", Customer: in.Customer})
		}, &engine.StepOpts[fakes.Charge]{Policy: &steps.Policy{MaxAttempts: 2, InitialInterval: time.Millisecond},
			Compensate: func(ctx context.Context, key steps.Key, ch fakes.Charge) error {
				_, err := gwClient.Refund(ctx, key, ch.ID)
				return err
			}})
		if err != nil {
			return "", err
		}
		if in.Amount == 9 {
			if _, err := engine.Await[string](ctx, "approved", nil); err != nil {
				return "", err
			}
		}
		if _, err := engine.Atomic(ctx, "ledger_posted", func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			if in.Customer == "cus_closed" {
				return struct{}{}, steps.Permanent("account_closed", errors.New("the ledger account is closed"))
			}
			return struct{}{}, nil
		}, &engine.AtomicOpts[struct{}]{Pivot: true}); err != nil {
			return "", err
		}
		if in.Amount == 7 {
			if _, err := engine.Await[string](ctx, "shipped", nil); err != nil {
				return "", err
			}
		}
		return ch.ID, nil
	}, &engine.WorkflowOpts{ErrorStatuses: map[string]int{"account_closed": http.StatusConflict}})
	require.NoError(t, err)

	// A start may name the queue "outbound" (no worker here starts it).
	b.engine, err = engine.NewClient(b.pool, &engine.Config{Workflows: workflows, StaleAfter: 30 * time.Second,
		Queues: []engine.Queue{{Name: "outbound", Concurrency: 1, Rate: engine.Rate{Limit: 10, Period: time.Minute}}}})
	require.NoError(t, err)
	if cfg == nil {
		cfg = &api.Config{}
	}
	cfg.Engine = b.engine
	b.handler, err = api.New(cfg)
	require.NoError(t, err)
	b.server = httptest.NewServer(b.handler)
	t.Cleanup(func() {
		select {
		case <-b.release:
		default:
			close(b.release)
		}
		b.server.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.engine.Shutdown(ctx)
	})
	return b
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request; headers come in name, value pairs.
func (b *testBundle) do(t testing.TB, method, path, body string, headers ...string) response {
	t.Helper()
	return b.request(t, http.DefaultClient, method, path, body, headers...)
}

// request is do with a client of the caller's.
func (b *testBundle) request(t testing.TB, client *http.Client, method, path, body string, headers ...string) response {
	t.Helper()
	r, err := b.send(client, method, path, body, headers...)
	require.NoError(t, err)
	return r
}

// send is request for goroutines other than the test's: it fails nothing.
func (b *testBundle) send(client *http.Client, method, path, body string, headers ...string) (response, error) {
	var rd io.Reader
	if body != "" {
		rd = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequest(method, b.server.URL+path, rd)
	if err != nil {
		return response{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: out}, err
}

// start posts a JSON input with an Idempotency-Key.
func (b *testBundle) start(t testing.TB, workflow, key, body string, headers ...string) response {
	t.Helper()
	h := append([]string{"Content-Type", "application/json", "Idempotency-Key", key}, headers...)
	return b.do(t, http.MethodPost, "/v1/workflows/"+workflow+"/runs", body, h...)
}

func (b *testBundle) counter(t testing.TB, name string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT coalesce((SELECT n FROM counters WHERE name = $1), 0)`, name).Scan(&n))
	return n
}

func (r response) String() string { return fmt.Sprintf("%d %s", r.status, r.body) }
