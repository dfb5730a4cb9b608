-- The child-key format of the runs a client creates when its
-- Config.KeyFormat is unset: the database's. A schema created by this
-- release starts with 3, the strongest (keys that name the request, so a
-- run lost in a failover and created again by the client's retry sends
-- the same keys; one index entry a run); a schema that existed keeps 1,
-- the format every release of it has sent, since a process of a release
-- before 0012 may still run against it. An operator moves an existing
-- database on, once no such process is left, with
--     UPDATE ratchet.settings SET key_format = 3;
-- which takes effect at the next run created, in every process.
--
-- migrations.Apply sets ratchet.fresh_schema for the session when it
-- finds no migration applied (docs/steps.md).
CREATE TABLE ratchet.settings (
    one        boolean  PRIMARY KEY DEFAULT true CHECK (one),
    key_format smallint NOT NULL CHECK (key_format IN (1, 2, 3))
);
INSERT INTO ratchet.settings (key_format)
    VALUES (CASE WHEN current_setting('ratchet.fresh_schema', true) = 'on' THEN 3 ELSE 1 END);
