-- Indexes that answer every shape of the runs listing (GET /v1/runs,
-- engine ListRuns) newest first without walking the table: the listing
-- writes one statement per shape of filters, and each shape reads one of
-- these (docs/performance.md lists which, with figures).
--
-- They order ids under the "C" collation, and so does the listing, while
-- the primary key orders them under the database's: the ids are ULIDs, in
-- the same order under either, but the planner sees that only these
-- indexes yield the listing's order. Without that, the generic plan of a
-- prepared listing (Postgres's after five executions, when it knows no
-- filter's value) would often walk the primary key backwards, filtering,
-- which reads the whole table when the filter matches little.

-- All of a tenant's runs.
DROP INDEX ratchet.runs_tenant_id_idx;
CREATE INDEX runs_tenant_id_idx ON ratchet.runs (tenant, id COLLATE "C" DESC);

-- Unfinished runs, for a blocked reason or an unfinished status. Only the
-- row versions of unfinished runs have an entry: a run's finish leaves
-- none behind, so it stays as small as the set of runs in flight.
CREATE INDEX runs_unfinished_idx ON ratchet.runs (tenant, id COLLATE "C" DESC) WHERE finished_at IS NULL;

-- Finished runs by status, and by workflow and status (a workflow alone
-- merges its four finished statuses). A run enters each once, when it
-- finishes (the versions before have finished_at NULL), and the keys grow
-- with time within a status or a workflow's status: inserts land on a few
-- rightmost leaves, which stay in the buffer cache, rather than on random
-- pages written whole after each checkpoint.
CREATE INDEX runs_finished_status_idx ON ratchet.runs (tenant, status, id COLLATE "C" DESC) WHERE finished_at IS NOT NULL;
CREATE INDEX runs_finished_workflow_idx ON ratchet.runs (tenant, workflow, status, id COLLATE "C" DESC) WHERE finished_at IS NOT NULL;
