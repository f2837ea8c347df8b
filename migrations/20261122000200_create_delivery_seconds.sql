-- Per-campaign, per-second delivery counts: what the graphs read. Workers add into rows
-- with INSERT .. ON CONFLICT DO UPDATE, so several of them can share a second.
-- No foreign key to campaigns: a flush must never fail (and stall sending) because a
-- campaign row was deleted while its counts were in memory.
CREATE TABLE delivery_seconds (
    campaign_id text        NOT NULL,
    second      timestamptz NOT NULL,
    sent        bigint      NOT NULL DEFAULT 0,
    failed      bigint      NOT NULL DEFAULT 0,
    retried     bigint      NOT NULL DEFAULT 0,
    -- The primary key also serves "a campaign's seconds in a time range".
    PRIMARY KEY (campaign_id, second),
    CONSTRAINT delivery_seconds_counts_non_negative CHECK (sent >= 0 AND failed >= 0 AND retried >= 0)
);
