-- Retention deletes completed progress rows by age; unfinished ones are never pruned.
CREATE INDEX job_progress_completed_at_idx ON job_progress (completed_at)
    WHERE completed_at IS NOT NULL;
