package engine

import "context"

// Claim and Execute split Start for tests: a run claimed and never
// executed is one whose executor died at once.
func (c *Client) Claim(ctx context.Context, p StartParams) (*StartResult, error) {
	return c.claim(ctx, p)
}

func (c *Client) Execute(ctx context.Context, res *StartResult) (*Run, error) {
	return c.executeClaimed(ctx, res)
}

// ListRunsSQL is the statement ListRuns sends for p, and its arguments.
func ListRunsSQL(p ListParams) (string, []any) {
	if p.Tenant == "" {
		p.Tenant = DefaultTenant
	}
	if p.Limit == 0 {
		p.Limit = 50
	}
	return listRunsSQL(&p)
}

// BlockedReasonSQL decides a run's blocked reason from its row (alias r).
const BlockedReasonSQL = blockedReasonSQL

// GateRunsSQL pages through the unfinished runs for the deploy gate.
const GateRunsSQL = gateRunsSQL

// CommitBatches reports the client's coalesced batches: sent, the
// statements in them, and those the server refused.
func (c *Client) CommitBatches() (batches, statements, refused int64) {
	return c.commits.batches.Load(), c.commits.statements.Load(), c.commits.refused.Load()
}

// ReadOnlyRetries reports how many statements the client's coalescer sent
// again after a standby refused them.
func (c *Client) ReadOnlyRetries() int64 { return c.commits.readOnly.Load() }
