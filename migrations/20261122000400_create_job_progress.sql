-- How far each job has got: devices_done counts the devices, in job order, that are
-- finished (delivered, or failed for good). Written in the same transaction as the
-- delivery counts, so a crash loses at most one flush interval of both.
CREATE TABLE job_progress (
    job_id        text        NOT NULL PRIMARY KEY,
    campaign_id   text        NOT NULL,
    partition     integer     NOT NULL,
    kafka_offset  bigint      NOT NULL,
    devices_total integer     NOT NULL,
    devices_done  integer     NOT NULL DEFAULT 0,
    completed_at  timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_progress_devices_total_non_negative CHECK (devices_total >= 0),
    CONSTRAINT job_progress_devices_done_range CHECK (devices_done >= 0 AND devices_done <= devices_total)
);
