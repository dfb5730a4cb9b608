package worker_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/internal/testdb"
	"github.com/ratchet-run/ratchet/worker"
)

// Starting a worker on a database nobody migrated says so as every other
// call does, with the fix, rather than with River's missing table.
func TestStartOnAnUnmigratedDatabaseReturnsErrNotMigrated(t *testing.T) {
	t.Parallel()
	pool := testdb.NewEmpty(t)
	w, err := worker.New(pool, &worker.Config{Engine: engine.Config{Workflows: engine.NewWorkflows()}})
	require.NoError(t, err)
	err = w.Start(context.Background())
	require.ErrorIs(t, err, engine.ErrNotMigrated)
	require.ErrorContains(t, err, "ratchet migrate")
	require.NoError(t, w.Stop(context.Background()))
}
