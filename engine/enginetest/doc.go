// Package enginetest is Ratchet's test kit, for the tests of applications
// that define workflows (as rivertest is River's). It gives each test a
// migrated Postgres database of its own, crashes a run right after a named
// phase as a killed process would, resumes it as another process would
// once the lease is stale, and asserts on the journal.
//
//	func TestRefund(t *testing.T) {
//		ctx := context.Background()
//		db := enginetest.New(t, nil)
//		client := newClient(t, db.Pool) // the application's own set-up
//		res, err := refund.Start(enginetest.CrashAfter(ctx, "refunded"), client, "r-1", in, nil)
//		// err wraps enginetest.ErrCrashed; the run is leased to a "dead" executor
//		other := newClient(t, db.Pool) // another process, with the same workflows
//		run, err := db.Recover(ctx, other, res.Run.ID)
//		enginetest.RequirePhases(t, other, run.ID, "looked_up", "refunded", "reversed")
//	}
//
// ExampleNewDatabase runs that sequence, and examples/refunds has a
// workflow's tests written with the kit.
//
// Postgres is found through DATABASE_URL (any database of the server: the
// kit creates and drops databases beside it, so the role needs CREATEDB),
// else at 127.0.0.1:5432 as the postgres user. Each database is cloned
// from a template with every Ratchet and River migration applied, named
// after a hash of them, so a schema change builds a new one; cloning takes
// a fraction of a second, so tests using the kit can run in parallel.
package enginetest
