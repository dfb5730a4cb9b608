package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratchet-run/ratchet/internal/fakes"
	"github.com/ratchet-run/ratchet/internal/pgboot"
	"github.com/ratchet-run/ratchet/migrations"
)

// chaosCmd groups the chaos commands: they break real processes and
// servers, on this machine, and report what survived.
type chaosCmd struct {
	Failover chaosFailoverCmd `cmd:"" help:"Promote a streaming standby mid-load (synchronous and asynchronous replication) and count what was lost, repeated and charged twice."`
}

type chaosFailoverCmd struct {
	Manager     string        `name:"manager" default:"manual" enum:"manual,patroni" help:"Who promotes the standby: manual (this command, pg_ctl promote, the moment the primary dies) or patroni (two Patroni nodes with etcd; Patroni promotes once the dead leader's key expires, 10 s)."`
	Fail        string        `name:"fail" default:"kill" enum:"kill,switchover" help:"How the primary goes: kill (SIGKILL, every process: a machine lost) or switchover (Patroni demotes it to a standby and promotes the other, as for maintenance; needs --manager patroni, and --stall does not apply)."`
	Replication []string      `name:"replication" default:"sync,async" enum:"sync,async" help:"Replication modes to run, each on a fresh primary and standby."`
	KeyFormats  []int         `name:"key-formats" default:"2,3" help:"Child-key formats the serve process creates runs with (--key-format), each a run of its own for each mode: 2 names the run, 3 the request."`
	Payments    int           `name:"payments" default:"2000" help:"Payments posted, each with its own Idempotency-Key, retried by its client until it has an answer."`
	Concurrency int           `name:"concurrency" default:"16" help:"Clients posting at once."`
	FailAfter   time.Duration `name:"fail-after" default:"2s" help:"How long the load runs, from its first answered payment, before the primary is stopped and the standby promoted."`
	Stall       time.Duration `name:"stall" default:"1s" help:"How long, just before the primary dies, it sends the standby no WAL (its WAL sender paused: a slow link); 0: none."`
	StaleAfter  time.Duration `name:"stale-after" default:"2s" help:"The serve process's lease length: how soon runs broken off by the failover are resumed."`
	Timeout     time.Duration `name:"timeout" default:"3m" help:"How long every payment has to finish."`
	JSON        bool          `name:"json" help:"Print one JSON object a run (the table's figures, as numbers) instead of the table, for scripts and tests."`
}

// failoverResult is one failover's figures: a row of the table, or a line
// of --json.
type failoverResult struct {
	Replication string `json:"replication"` // sync or async
	KeyFormat   int    `json:"key_format"`
	// LagBytes is how far behind the standby was when the primary failed.
	LagBytes  int64 `json:"lag_bytes"`
	Payments  int   `json:"payments"`
	Succeeded int   `json:"succeeded"`
	// AnsweredBefore is how many payments were answered before the
	// failover; Lost, how many of those the new primary lacked (their
	// clients sent them again).
	AnsweredBefore int `json:"answered_before"`
	Lost           int `json:"lost"`
	// StepsRepeated counts gateway keys called more than once and charged
	// once: a repeat the key deduplicated.
	StepsRepeated     int `json:"steps_repeated"`
	DuplicateCharges  int `json:"duplicate_charges"`
	ReceiptsResent    int `json:"receipts_resent"`
	DuplicateReceipts int `json:"duplicate_receipts"`
	MissingReceipts   int `json:"missing_receipts"`
	Answers503        int `json:"answers_503"`
	// Answers5xx counts answers of 500 and above but 503: never expected.
	Answers5xx    int `json:"answers_5xx"`
	ReadOnlyDrops int `json:"read_only_drops"`
	RunsFailed    int `json:"runs_failed"`
	// FirstAnswer is from the failure to the first answer to a request
	// sent after it (0: none was); AllDone, from the failure to every run
	// finished.
	FirstAnswer time.Duration `json:"first_answer_ns"`
	AllDone     time.Duration `json:"all_done_ns"`
}

// cells are the row's cells after the mode's.
func (r failoverResult) cells() string {
	first := "-"
	if r.FirstAnswer > 0 {
		first = r.FirstAnswer.Round(100 * time.Millisecond).String()
	}
	return fmt.Sprintf("%d\t%d/%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d/%d\t%d\t%d\t%s\t%s",
		r.LagBytes, r.Succeeded, r.Payments, r.AnsweredBefore, r.Lost, r.StepsRepeated, r.DuplicateCharges,
		r.ReceiptsResent, r.DuplicateReceipts, r.MissingReceipts, r.Answers503, r.Answers5xx, r.ReadOnlyDrops,
		r.RunsFailed, first, r.AllDone.Round(100*time.Millisecond))
}

// Run runs the failover for each replication mode and prints one row each.
func (c *chaosFailoverCmd) Run(e *env) error {
	if c.Payments < 1 || c.Concurrency < 1 || c.FailAfter <= 0 || c.StaleAfter < 100*time.Millisecond || c.Timeout <= 0 {
		return fmt.Errorf("--payments, --concurrency, --fail-after and --timeout must be positive, --stale-after at least 100ms")
	}
	if err := checkKeyFormats(c.KeyFormats); err != nil {
		return err
	}
	if c.Fail == "switchover" {
		if c.Manager != "patroni" {
			return fmt.Errorf("--fail switchover needs --manager patroni: a switchover is the manager's")
		}
		c.Stall = 0 // a demoted primary's shutdown waits for its WAL sender
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	intro := e.stdout
	if c.JSON {
		intro = e.stderr // stdout is the results', a JSON object a line
	}
	fmt.Fprintf(intro, "%d payments from %d clients, each retried with its key until answered; the primary %s %s after the first answer,\n"+
		"the primary's WAL sender paused for the last %s before (a slow link);\n"+
		"one ratchet serve process (with its worker, --stale-after %s) on the multi-host URL with target_session_attrs=read-write;\n"+
		"a payment answered before the failover whose run the new primary lacks is sent again by its client afterwards;\n"+
		"%s.\n",
		c.Payments, c.Concurrency, failure[c.Fail], c.FailAfter, c.Stall, c.StaleAfter, promoter[c.Manager+" "+c.Fail])
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	enc := json.NewEncoder(e.stdout)
	if !c.JSON {
		fmt.Fprintln(tw, "replication\tkey format\tWAL behind at failover\tsucceeded\tacknowledged before\tacknowledged runs lost, sent again\tsteps repeated, same key\tduplicate charges\treceipts redelivered, same id\tduplicate receipts\tmissing receipts\t5xx answers (503/500)\tread-only drops\truns failed\tfailure to first answer\tfailover to all done\t")
	}
	for _, mode := range c.Replication {
		for _, format := range c.KeyFormats {
			fmt.Fprintf(e.stderr, "%s replication, key format %d: starting a primary and a standby\n", mode, format)
			r, err := c.once(e, self, mode == "sync", format)
			if err != nil {
				return fmt.Errorf("%s replication, key format %d: %w", mode, format, err)
			}
			r.Replication, r.KeyFormat = mode, format
			if c.JSON {
				if err := enc.Encode(r); err != nil {
					return err
				}
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t\n", mode, format, r.cells())
		}
	}
	return tw.Flush()
}

// failure says, for each --fail, what befalls the primary.
var failure = map[string]string{
	"kill":       "killed (SIGKILL, every process) and the standby promoted",
	"switchover": "demoted to a standby and the standby promoted, by a switchover asked of Patroni,",
}

// promoter says, for each --manager and --fail, who promotes the standby.
var promoter = map[string]string{
	"manual kill":        "the standby promoted by this command (pg_ctl promote) as soon as the primary is dead",
	"patroni kill":       "two Patroni nodes (synchronous_mode for sync) with etcd: the leader's agent killed with its Postgres, Patroni promotes the standby once the leader key expires (ttl 10 s)",
	"patroni switchover": "two Patroni nodes (synchronous_mode for sync) with etcd: POST /switchover to the leader's agent, which stops its Postgres, has the standby promoted and restarts its own as a standby, read-only at the first address of the URL",
}

// failoverPair is a primary and a standby streaming from it: pgboot's
// Pair, promoted by this command, or a Patroni cluster, which promotes by
// itself.
type failoverPair interface {
	Stall(context.Context) error
	Lag(context.Context) (int64, error)
	Fail(context.Context) error
	// Switchover has the manager demote the primary and promote the
	// standby, returning once the standby accepts writes.
	Switchover(context.Context) error
	KilledAt() time.Time // when Fail's kill had completed, or Switchover was asked
	Stop() error
}

// startPair starts the pair --manager names and returns it with the URL
// that reaches whichever of the two accepts writes.
func (c *chaosFailoverCmd) startPair(ctx context.Context, synchronous bool) (failoverPair, string, error) {
	if c.Manager == "patroni" {
		p, err := pgboot.StartPatroni(ctx, synchronous)
		if err != nil {
			return nil, "", err
		}
		return p, p.URL, nil
	}
	p, err := pgboot.StartPair(ctx, synchronous)
	if err != nil {
		return nil, "", err
	}
	return p, p.URL, nil
}

// ack is a payment's answer as its client saw it.
type ack struct {
	runID, status string
	sent, at      time.Time // the answered request's sending, the answer's arrival
}

// once runs the failover on a fresh pair and returns its figures but the
// mode's.
func (c *chaosFailoverCmd) once(e *env, self string, synchronous bool, keyFormat int) (failoverResult, error) {
	ctx := e.ctx
	pair, url, err := c.startPair(ctx, synchronous)
	if err != nil {
		return failoverResult{}, err
	}
	defer func() {
		if err := pair.Stop(); err != nil {
			fmt.Fprintf(e.stderr, "ratchet: stopping the pair: %v\n", err)
		}
	}()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return failoverResult{}, err
	}
	defer pool.Close()
	if _, err := migrations.Apply(ctx, pool, nil); err != nil {
		return failoverResult{}, err
	}
	gateway, mail := fakes.NewGateway(nil), fakes.NewMail(nil)
	gwURL, stopGw, err := listen(ctx, gateway)
	if err != nil {
		return failoverResult{}, err
	}
	defer stopGw()
	mailURL, stopMail, err := listen(ctx, mail)
	if err != nil {
		return failoverResult{}, err
	}
	defer stopMail()
	procs, err := startServes(ctx, self, 1, withPoolSize(url, 40), "--gateway-url", gwURL, "--mail-url", mailURL,
		"--stale-after", c.StaleAfter.String(), "--key-format", strconv.Itoa(keyFormat))
	if err != nil {
		return failoverResult{}, err
	}
	defer stopServes(procs)
	base := procs[0].base

	var (
		mu     sync.Mutex
		acks   = map[int]ack{}
		next   atomic.Int64
		wg     sync.WaitGroup
		client = &http.Client{Timeout: 30 * time.Second}
		// answered closes at the first answer: the failover is timed from
		// the load running, not from the processes starting, which a
		// loaded machine makes slow.
		answered  = make(chan struct{})
		firstOnce sync.Once
		// unavailable and broken count the answers 503 and 500: a
		// failover may be the first, never the second.
		unavailable, broken atomic.Int64
	)
	deadline := time.Now().Add(c.Timeout)
	for range c.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= c.Payments {
					return
				}
				for time.Now().Before(deadline) {
					a, code, ok := postPayment(ctx, client, base, i)
					switch {
					case code == http.StatusServiceUnavailable:
						unavailable.Add(1)
					case code >= 500:
						broken.Add(1)
					}
					if ok {
						mu.Lock()
						acks[i] = a
						mu.Unlock()
						firstOnce.Do(func() { close(answered) })
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}

	select {
	case <-answered:
	case <-time.After(time.Until(deadline)):
		return failoverResult{}, fmt.Errorf("no payment answered within --timeout %s", c.Timeout)
	case <-ctx.Done():
		return failoverResult{}, ctx.Err()
	}
	time.Sleep(max(c.FailAfter-c.Stall, 0))
	if c.Stall > 0 {
		if err := pair.Stall(ctx); err != nil {
			return failoverResult{}, err
		}
		time.Sleep(c.Stall)
	}
	lag, err := pair.Lag(ctx)
	if err != nil {
		return failoverResult{}, err
	}
	mu.Lock()
	before := map[int]ack{}
	for i, a := range acks {
		before[i] = a
	}
	mu.Unlock()
	fmt.Fprintf(e.stderr, "  failing the primary by %s (%d payments answered so far, standby %d bytes of WAL behind)\n", c.Fail, len(before), lag)
	failedAt := time.Now()
	fail := pair.Fail
	if c.Fail == "switchover" {
		fail = pair.Switchover
	}
	if err := fail(ctx); err != nil {
		return failoverResult{}, err
	}
	wg.Wait()
	// The first answer to a request sent after the kill: how long clients
	// went unanswered (a request sent before the kill may have been
	// answered by the old primary, which says nothing of the new one).
	var first time.Duration
	killed := pair.KilledAt()
	for _, a := range acks {
		if a.sent.After(killed) && (first == 0 || a.at.Sub(killed) < first) {
			first = a.at.Sub(killed)
		}
	}

	// Runs whose clients had their answer before a later state was lost
	// are finished by the worker's recoverer: wait for the runs in flight.
	if err := settle(ctx, pool, c.Timeout); err != nil {
		return failoverResult{}, err
	}
	runs, err := runsByKey(ctx, pool)
	if err != nil {
		return failoverResult{}, err
	}
	// A run answered and missing after the failover is lost. Its
	// client, learning that (say, by asking for the payment), sends it
	// again with its key: the same call downstream, with keys of format 3.
	// (Answers that reached their clients while the primary was being
	// killed count too: every answer is the client's by now.)
	var lost []int
	for i := range c.Payments {
		if a, ok := acks[i]; ok && runs[chaosKey(i)][0] != a.runID {
			lost = append(lost, i)
		}
	}
	resendBy := time.Now().Add(c.Timeout)
	for _, i := range lost {
		for time.Now().Before(resendBy) {
			if _, _, ok := postPayment(ctx, client, base, i); ok {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err := settle(ctx, pool, c.Timeout); err != nil {
		return failoverResult{}, err
	}
	allDone := time.Since(failedAt)
	if runs, err = runsByKey(ctx, pool); err != nil {
		return failoverResult{}, err
	}
	succeeded, others := 0, map[string]int{}
	for i := range c.Payments {
		switch st := runs[chaosKey(i)][1]; st {
		case "succeeded":
			succeeded++
		case "":
			others["no run"]++
		default:
			others[st]++
		}
	}
	if len(others) > 0 {
		fmt.Fprintf(e.stderr, "  payments not succeeded, by their run's status: %v\n", others)
	}
	// Receipts are River jobs worked after their run's ledger phase: wait
	// for one per succeeded payment (a job broken off by the failover is
	// retried after River's rescue and backoff), or a minute.
	receiptsBy := time.Now().Add(time.Minute)
	for time.Now().Before(receiptsBy) {
		got := mail.Stats().DeliveriesByRecipient
		missing := 0
		for i := range c.Payments {
			if runs[chaosKey(i)][1] == "succeeded" && got[chaosEmail(i)] == 0 {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	charges := map[string]int{}
	for _, ch := range gateway.Charges() {
		charges[ch.Customer]++
	}
	duplicates := 0
	for _, n := range charges {
		duplicates += max(n-1, 0)
	}
	repeated := 0
	stats := gateway.Stats()
	for key, n := range stats.RequestsByKey {
		if n > 1 && stats.ChargesByKey[key] == 1 {
			repeated++
		}
	}
	// A receipt delivered again with the same message id is the outbox's
	// at-least-once delivery (a receiver can drop it by its id); one with
	// another message id comes from another run of the same payment.
	ids := map[string]map[string]int{} // recipient: message id: deliveries
	for _, msg := range mail.Delivered() {
		if ids[msg.To] == nil {
			ids[msg.To] = map[string]int{}
		}
		ids[msg.To][msg.MessageID]++
	}
	redelivered, dupReceipts, missingReceipts := 0, 0, 0
	for i := range c.Payments {
		byID := ids[chaosEmail(i)]
		dupReceipts += max(len(byID)-1, 0)
		for _, n := range byID {
			redelivered += n - 1
		}
		if len(byID) == 0 && runs[chaosKey(i)][1] == "succeeded" {
			missingReceipts++
		}
	}
	return failoverResult{
		LagBytes: lag, Payments: c.Payments, Succeeded: succeeded,
		AnsweredBefore: len(before), Lost: len(lost),
		StepsRepeated: repeated, DuplicateCharges: duplicates,
		ReceiptsResent: redelivered, DuplicateReceipts: dupReceipts, MissingReceipts: missingReceipts,
		Answers503: int(unavailable.Load()), Answers5xx: int(broken.Load()),
		ReadOnlyDrops: procs[0].readOnly.Count(), RunsFailed: others["failed"],
		FirstAnswer: first, AllDone: allDone,
	}, nil
}

func chaosKey(i int) string   { return fmt.Sprintf("failover-%d", i) }
func chaosEmail(i int) string { return fmt.Sprintf("p%d@example.com", i) }

// postPayment posts payment i and reports its answer when the run has
// finished (201, or 200 for a replay); anything else (a 202, a 409 while it
// runs elsewhere, a 503, a broken connection) is to be retried.
// settle waits until no run is unfinished, or for at most timeout.
func settle(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) error {
	by := time.Now().Add(timeout)
	for {
		var unfinished int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM ratchet.runs WHERE finished_at IS NULL`).Scan(&unfinished); err != nil {
			return err
		}
		if unfinished == 0 || time.Now().After(by) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runsByKey reads every run's id and status by its idempotency key.
func runsByKey(ctx context.Context, pool *pgxpool.Pool) (map[string][2]string, error) {
	rows, err := pool.Query(ctx, `SELECT idempotency_key, id, status FROM ratchet.runs`)
	if err != nil {
		return nil, err
	}
	runs := map[string][2]string{}
	var key, id, status string
	_, err = pgx.ForEachRow(rows, []any{&key, &id, &status}, func() error {
		runs[key] = [2]string{id, status}
		return nil
	})
	return runs, err
}

// The status is 0 when no answer came.
func postPayment(ctx context.Context, client *http.Client, base string, i int) (a ack, status int, ok bool) {
	body := fmt.Sprintf(`{"amount": %d, "currency": "usd", "customer": "cus_failover_%d", "email": %q}`, 100+i, i, chaosEmail(i))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/workflows/payment/runs", strings.NewReader(body))
	if err != nil {
		return ack{}, 0, false
	}
	req.Header.Set("Idempotency-Key", chaosKey(i))
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return ack{}, 0, false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return ack{}, resp.StatusCode, false
	}
	var run struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if json.Unmarshal(b, &run) != nil || (run.Status != "succeeded" && run.Status != "failed") {
		return ack{}, resp.StatusCode, false
	}
	return ack{runID: run.ID, status: run.Status, sent: sent, at: time.Now()}, resp.StatusCode, true
}
