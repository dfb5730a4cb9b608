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
