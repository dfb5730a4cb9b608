package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Verdict is the deploy gate's answer for one run in flight.
type Verdict string

const (
	// VerdictCompatible: this build replays the run's journal to its end
	// (or to the run's end): it can finish the run.
	VerdictCompatible Verdict = "compatible"
	// VerdictIncompatible: this build's code diverges from the journal
	// (another phase at a position, a journaled output or the input that
	// no longer decodes, an undo no longer registered, a panic).
	VerdictIncompatible Verdict = "incompatible"
	// VerdictUnregistered: this build does not register the workflow
	// version the run started on.
	VerdictUnregistered Verdict = "unregistered"
)

// RunCheck is the deploy gate's finding for one run.
type RunCheck struct {
	RunID    string  `json:"run_id"`
	Workflow string  `json:"workflow"`
	Version  int     `json:"version"`
	Status   Status  `json:"status"`
	Verdict  Verdict `json:"verdict"`
	// Seq is the journal position where the code diverges; Journaled the
	// phase the journal holds there and Called the one the code asked for
	// ("" when it returned instead).
	Seq       *int   `json:"seq,omitempty"`
	Journaled string `json:"journaled,omitempty"`
	Called    string `json:"called,omitempty"`
	// Reason says what is wrong, in words.
	Reason string `json:"reason,omitempty"`
}

// DeployReport is what CheckDeploy found. The counts are exact; Problems
// lists the runs this build cannot finish, in id order, up to
// CheckDeployOpts.MaxProblems.
type DeployReport struct {
	Checked      int `json:"checked"`
	Compatible   int `json:"compatible"`
	Incompatible int `json:"incompatible"`
	Unregistered int `json:"unregistered"`
	// InFlight counts the runs checked by "workflow@version": how far an
	// old version has drained.
	InFlight map[string]int `json:"in_flight"`
	Problems []RunCheck     `json:"problems"`
	// TookMS is how long the check took, in milliseconds.
	TookMS int64 `json:"took_ms"`
}

// OK reports whether this build can finish every run in flight.
func (r *DeployReport) OK() bool { return r.Incompatible == 0 && r.Unregistered == 0 }

// CheckDeployOpts are options for CheckDeploy. A nil *CheckDeployOpts is
// valid.
type CheckDeployOpts struct {
	// Concurrency is how many runs are replayed at once. Defaults to
	// GOMAXPROCS.
	Concurrency int
	// RunTimeout bounds one run's replay: workflow code that blocks
	// between phases is reported incompatible after it. Defaults to 5s.
	RunTimeout time.Duration
	// MaxProblems bounds DeployReport.Problems. Defaults to 1000.
	MaxProblems int
}

// errDryEnd stops the deploy gate's replay at the first phase past the
// journal.
var errDryEnd = errors.New("engine: the replay reached the end of the journal")

// noHooks observes nothing: the deploy gate's replay makes no spans.
type noHooks struct{}

func (noHooks) Run(ctx context.Context, _ RunInfo) (context.Context, func(RunEnd)) {
	return ctx, func(RunEnd) {}
}

func (noHooks) Phase(ctx context.Context, _ PhaseInfo) (context.Context, func(error)) {
	return ctx, func(error) {}
}

// gateRunsSQL pages through the unfinished runs by tenant and id, the
// order of the index of unfinished runs (whatever the history's size, the
// gate reads only them).
const gateRunsSQL = `SELECT ` + runColumns + ` FROM ratchet.runs
WHERE finished_at IS NULL AND (tenant, id COLLATE "C") > ($1, $2)
ORDER BY tenant, id COLLATE "C" LIMIT $3`

const gatePhasesSQL = `SELECT ` + phaseColumns + `
FROM ratchet.phases WHERE run_id = ANY($1) ORDER BY run_id, seq`

// gatePage is how many runs the gate reads per round trip.
const gatePage = 2000

// CheckDeploy is the deploy gate: it replays, against this client's
// registry, the journal of every unfinished run — running, pending,
// waiting, compensating — and reports whether this build can finish each.
// Phases answer from the journal; none runs, nothing is written (the runs
// are read in one read-only transaction), no span is made. The first
// phase past a run's journal ends its replay: what comes after is new
// code, which any build may run. A run whose journal the code contradicts,
// whose input or journaled output no longer decodes, or whose version this
// build does not register, is a problem.
//
// The workflow function itself is called: its code between phases must
// have no effects (the engine's rule for any replay).
func (c *Client) CheckDeploy(ctx context.Context, opts *CheckDeployOpts) (*DeployReport, error) {
	var o CheckDeployOpts
	if opts != nil {
		o = *opts
	}
	if o.Concurrency <= 0 {
		o.Concurrency = runtime.GOMAXPROCS(0)
	}
	if o.RunTimeout <= 0 {
		o.RunTimeout = 5 * time.Second
	}
	if o.MaxProblems <= 0 {
		o.MaxProblems = 1000
	}
	began := time.Now()
	report := &DeployReport{InFlight: map[string]int{}, Problems: []RunCheck{}}

	type job struct {
		run     *Run
		journal []Phase
	}
	jobs := make(chan job, gatePage)
	checks := make(chan RunCheck, gatePage)
	var workers sync.WaitGroup
	for range o.Concurrency {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for j := range jobs {
				checks <- c.checkRun(ctx, j.run, j.journal, o.RunTimeout)
			}
		}()
	}
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for rc := range checks {
			report.Checked++
			report.InFlight[served(rc.Workflow, rc.Version)]++
			switch rc.Verdict {
			case VerdictCompatible:
				report.Compatible++
				continue
			case VerdictIncompatible:
				report.Incompatible++
			case VerdictUnregistered:
				report.Unregistered++
			}
			report.Problems = append(report.Problems, rc)
		}
	}()

	err := pgx.BeginTxFunc(ctx, c.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var afterTenant, after string
		for {
			rows, err := tx.Query(ctx, gateRunsSQL, afterTenant, after, gatePage)
			if err != nil {
				return notMigrated(err)
			}
			runs, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[Run])
			if err != nil || len(runs) == 0 {
				return err
			}
			ids := make([]string, len(runs))
			for i, r := range runs {
				ids[i] = r.ID
			}
			rows, err = tx.Query(ctx, gatePhasesSQL, ids)
			if err != nil {
				return err
			}
			phases, err := pgx.CollectRows(rows, pgx.RowToStructByName[Phase])
			if err != nil {
				return err
			}
			byRun := make(map[string][]Phase, len(runs))
			for _, p := range phases {
				byRun[p.RunID] = append(byRun[p.RunID], p)
			}
			for _, r := range runs {
				select {
				case jobs <- job{run: r, journal: byRun[r.ID]}:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			afterTenant, after = runs[len(runs)-1].Tenant, runs[len(runs)-1].ID
		}
	})
	close(jobs)
	workers.Wait()
	close(checks)
	<-collected
	if err != nil {
		return nil, fmt.Errorf("engine: check deploy: %w", err)
	}
	sort.Slice(report.Problems, func(i, j int) bool { return report.Problems[i].RunID < report.Problems[j].RunID })
	if len(report.Problems) > o.MaxProblems {
		report.Problems = report.Problems[:o.MaxProblems]
	}
	report.TookMS = time.Since(began).Milliseconds()
	return report, nil
}

// checkRun replays one run's journal without effects and judges it.
func (c *Client) checkRun(ctx context.Context, run *Run, journal []Phase, timeout time.Duration) RunCheck {
	rc := RunCheck{RunID: run.ID, Workflow: run.Workflow, Version: run.WorkflowVersion, Status: run.Status, Verdict: VerdictIncompatible}
	def, err := c.workflows.lookupVersion(run.Workflow, run.WorkflowVersion)
	if err != nil {
		rc.Verdict = VerdictUnregistered
		rc.Reason = fmt.Sprintf("no version %d of %q is registered in this build", run.WorkflowVersion, run.Workflow)
		return rc
	}
	if err := def.checkInput(run.Input); err != nil {
		rc.Reason = fmt.Sprintf("the run's input no longer decodes: %v", err)
		return rc
	}

	forward, undone, cause := splitJournal(journal)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ctx, lose := context.WithCancelCause(ctx)
	defer lose(nil)
	ex := &execution{c: c, def: def, run: run, journal: forward, lose: lose, used: map[string]bool{},
		cancelled: run.CancelRequestedAt != nil, pivoted: run.Pivot != nil, compensating: run.Status == StatusCompensating,
		cause: cause, undone: undone, seqEnd: len(journal), patches: map[string]bool{}, hooks: noHooks{}, dry: true}
	done := make(chan error, 1)
	go func() {
		_, err := ex.invoke(context.WithValue(ctx, executionKey{}, ex))
		done <- err
	}()
	var werr error
	select {
	case werr = <-done:
	case <-ctx.Done():
		rc.Reason = fmt.Sprintf("the workflow did not reach its next phase within %s of replay: code between phases must not block", timeout)
		return rc
	}

	ex.mu.Lock()
	defer ex.mu.Unlock()
	var (
		nd *NonDeterminismError
		pe *panicError
	)
	switch {
	case errors.As(ex.fatal, &nd):
		rc.Seq, rc.Journaled, rc.Called = &nd.Seq, nd.Journaled, nd.Called
		rc.Reason = nd.Error()
		return rc
	case ex.fatal != nil:
		rc.Reason = ex.fatal.Error()
		return rc
	case ex.replayErr != nil:
		rc.Seq = &ex.replaySeq
		if ex.replaySeq < len(ex.journal) {
			rc.Journaled = ex.journal[ex.replaySeq].Name
		}
		rc.Reason = ex.replayErr.Error()
		return rc
	case errors.As(werr, &pe):
		rc.Reason = pe.Error()
		return rc
	case !ex.dryEnd && ex.next < len(ex.journal) && !errors.Is(werr, errCompensating):
		seq := ex.next
		rc.Seq, rc.Journaled = &seq, ex.journal[seq].Name
		rc.Reason = fmt.Sprintf("the workflow returned before phase %d, but the journal holds %q there", seq, ex.journal[seq].Name)
		return rc
	}
	if ex.compensating {
		registered := map[string]bool{}
		for _, u := range ex.undos {
			registered[u.phase] = true
		}
		for _, p := range ex.journal {
			if p.Compensable && !registered[p.Name] && !ex.undone[undoPrefix+p.Name] {
				rc.Reason = fmt.Sprintf("the run is compensating and phase %q committed with an undo this build does not register", p.Name)
				return rc
			}
		}
	}
	rc.Verdict = VerdictCompatible
	return rc
}

// markDryEnd records, in the deploy gate's replay, that the workflow went
// past its journal.
func (ex *execution) markDryEnd() {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.dry {
		ex.dryEnd = true
	}
}

// noteReplayFailure records, in the deploy gate's replay, that a journaled
// output at seq no longer decodes into what the code asks for.
func (ex *execution) noteReplayFailure(seq int, err error) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.dry && ex.replayErr == nil {
		ex.replayErr, ex.replaySeq = err, seq
	}
}

// positionOf is the journal position of phase name, or the next position.
func (ex *execution) positionOf(name string) int {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	for i, p := range ex.journal {
		if p.Name == name {
			return i
		}
	}
	return ex.next
}
