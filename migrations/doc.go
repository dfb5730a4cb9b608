// Package migrations owns Ratchet's database schema: numbered SQL files
// embedded in the binary for the ratchet schema (runs and their phase
// journal), followed by River's own migrations, placed in the same schema.
//
// Apply brings a database up to date. It is idempotent and serialised by a
// Postgres advisory lock, so any number of processes may call it at start-up.
//
// This package is a leaf: it imports no other Ratchet package.
package migrations
