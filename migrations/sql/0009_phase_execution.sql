-- Which execution of the run committed each phase: the run's attempt
-- number under the lease that wrote it, read inside the fenced statement
-- that writes the phase. Every later execution of the run replayed the
-- phase from the journal rather than running it, which is what an
-- operator's timeline shows. NULL for phases committed before this column.
ALTER TABLE ratchet.phases ADD COLUMN execution integer;
