package pgboot_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/internal/pgboot"
)

func TestStartsAThrowawayClusterAndDeletesIt(t *testing.T) {
	t.Parallel()
	if _, err := pgboot.FindBin(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	c, err := pgboot.Start(ctx)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, c.URL)
	require.NoError(t, err)
	var one int
	require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.NoError(t, conn.Close(ctx))

	require.NoError(t, c.Stop())
	_, err = pgx.Connect(ctx, c.URL)
	require.Error(t, err, "the server is stopped")
	_, err = os.Stat(c.Dir)
	require.True(t, os.IsNotExist(err), "the cluster's directory is deleted")
}
