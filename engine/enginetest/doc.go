// Package enginetest is Ratchet's test kit, for the tests of applications
// that define workflows (as rivertest is River's). It gives each test a
// migrated Postgres database of its own, crashes a run right after a named
// phase as a killed process would, resumes it as another process would
// once the lease is stale, and asserts on the journal.
//
//	func TestRefund(t *testing.T) {
//		db := enginetest.New(t, nil)
//		client := newClient(t, db.Pool) // the application's own set-up
//		_, err := refund.Start(enginetest.CrashAfter(ctx, "refunded"), client, "r-1", in, nil)
//		// err wraps enginetest.ErrCrashed; the run is leased to a "dead" process
//		run, err := enginetest.Recover(ctx, otherClient, runID)
//		enginetest.RequirePhases(t, otherClient, runID, "looked_up", "refunded", "reversed")
//	}
//
// Postgres is found through DATABASE_URL (any database of the server: the
// kit creates and drops databases beside it, so the role needs CREATEDB),
// else at 127.0.0.1:5432 as the postgres user. Each database is cloned
// from a template with every Ratchet and River migration applied, named
// after a hash of them, so a schema change builds a new one; cloning takes
// a fraction of a second, so tests using the kit can run in parallel.
package enginetest
