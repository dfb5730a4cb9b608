// Package schema tells the errors of a database without Ratchet's schema
// apart, for every package that meets them first.
package schema

import (
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// Missing reports whether err is Postgres naming a table or schema that
// does not exist.
func Missing(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == pgerrcode.UndefinedTable || pgErr.Code == pgerrcode.InvalidSchemaName)
}

// NotMigrated wraps err with sentinel, and what to do, when err is Missing;
// it returns any other error as it is.
func NotMigrated(err, sentinel error) error {
	if Missing(err) {
		return fmt.Errorf("%w: run `ratchet migrate` (or migrations.Apply) against this database: %w", sentinel, err)
	}
	return err
}
