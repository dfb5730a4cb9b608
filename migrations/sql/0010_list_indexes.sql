-- Indexes that answer every shape of the runs listing (GET /v1/runs,
-- engine ListRuns) newest first without walking the table: the listing
-- writes one statement per shape of filters, and each shape reads these
-- (docs/performance.md lists which, with figures). They replace the index
-- of all runs by tenant and id, which every update of a run had to
-- maintain; these hold a run once it has finished, or while it has not.
--
-- They order ids under the "C" collation, and so does the listing, while
-- the primary key orders them under the database's: the ids are ULIDs, in
-- the same order under either, but the planner sees that only these
-- indexes yield the listing's order. Without that, the generic plan of a
-- prepared listing (Postgres's after five executions, when it knows no
-- filter's value) would often walk the primary key backwards, filtering,
-- which reads the whole table when the filter matches little.

DROP INDEX ratchet.runs_tenant_id_idx;

-- Unfinished runs: for a blocked reason, an unfinished status, the
-- unfinished part of any other listing, and the deploy gate. Only the
-- row versions of unfinished runs have an entry: a run's finish leaves
-- none behind, so it stays as small as the set of runs in flight.
CREATE INDEX runs_unfinished_idx ON ratchet.runs (tenant, id COLLATE "C") WHERE finished_at IS NULL;

-- Finished runs by status, and by workflow and status (a listing of all
-- statuses merges the ranges of the four). A run enters each once, when
-- it finishes (the versions before have finished_at NULL), and the keys
-- grow with time within a status or a workflow's status: inserts land on a
-- few rightmost leaves, which stay in the buffer cache, rather than on
-- random pages written whole after each checkpoint.
CREATE INDEX runs_finished_status_idx ON ratchet.runs (tenant, status, id COLLATE "C") WHERE finished_at IS NOT NULL;
CREATE INDEX runs_finished_workflow_idx ON ratchet.runs (tenant, workflow, status, id COLLATE "C") WHERE finished_at IS NOT NULL;

-- The index of runs awaiting a signal by correlation key covered every
-- waiting run, so a listing of waiting runs could read it: in whole, and
-- sort what it read, where the statistics of a large history (in which a
-- waiting run is rare) made it look like a row or two. It now covers the
-- runs awaiting a signal, which the delivery's lookup states and the
-- listing does not.
DROP INDEX ratchet.runs_awaiting_idx;
CREATE INDEX runs_awaiting_idx ON ratchet.runs (tenant, (waiting_for->>'signal'), (waiting_for->>'correlation_key'))
    WHERE status = 'waiting' AND (waiting_for->>'signal') IS NOT NULL;
