-- What each running worker holds of each campaign, for progress and ETA summed over the
-- workers (issue 23). Each worker rewrites its rows about once a second and deletes them
-- at shutdown; readers take only rows written in the last few seconds, so a worker that
-- died without deleting drops out by itself. Unlogged: it is state, rebuilt within a
-- second, not history.
CREATE UNLOGGED TABLE worker_campaigns (
    campaign_id    text             NOT NULL,
    worker_id      text             NOT NULL,
    held           bigint           NOT NULL CHECK (held >= 0),
    parked         bigint           NOT NULL CHECK (parked >= 0),
    effective_rate double precision NOT NULL,
    total_devices  bigint,
    updated_at     timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (campaign_id, worker_id)
);
CREATE INDEX worker_campaigns_worker_idx ON worker_campaigns (worker_id);
