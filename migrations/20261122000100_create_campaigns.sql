-- Campaign settings. Constraint names are part of the API: the store maps a violated
-- CHECK back to the field it guards, so the error can name it.
CREATE TABLE campaigns (
    id          text             NOT NULL PRIMARY KEY,
    send_rate   double precision NOT NULL,
    algorithm   text             NOT NULL,
    burst       integer          NOT NULL DEFAULT 0,
    status      text             NOT NULL DEFAULT 'active',
    created_at  timestamptz      NOT NULL DEFAULT now(),
    updated_at  timestamptz      NOT NULL DEFAULT now(),
    CONSTRAINT campaigns_id_length CHECK (char_length(id) BETWEEN 1 AND 128),
    -- NaN compares greater than every number in PostgreSQL, so the upper bound rejects it too.
    CONSTRAINT campaigns_send_rate_range CHECK (send_rate > 0 AND send_rate <= 10000000),
    CONSTRAINT campaigns_algorithm_known CHECK (algorithm IN (
        'leaky-bucket', 'token-bucket', 'fixed-window', 'sliding-log',
        'sliding-window', 'gcra', 'governor')),
    CONSTRAINT campaigns_burst_non_negative CHECK (burst >= 0),
    CONSTRAINT campaigns_status_known CHECK (status IN ('active', 'paused', 'done'))
);
