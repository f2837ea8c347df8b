-- Per-campaign, per-minute delivery counts (issue 24): retention rolls delivery_seconds
-- rows older than `database.rollup_after_ms` into these and deletes them, in the same
-- statement, so every count is in exactly one of the two tables. A long chart reads the
-- minutes (1,440 rows per campaign-day instead of up to 86,400 seconds).
--
-- No trigger: campaign_totals already holds these counts (they were counted when their
-- seconds were written) and there is no DELETE trigger on delivery_seconds, so the
-- rollup changes no total. Like delivery_seconds, no foreign key to campaigns.
CREATE TABLE delivery_minutes (
    campaign_id     text        NOT NULL,
    minute          timestamptz NOT NULL,
    sent            bigint      NOT NULL DEFAULT 0,
    failed          bigint      NOT NULL DEFAULT 0,
    retried         bigint      NOT NULL DEFAULT 0,
    skipped_invalid bigint      NOT NULL DEFAULT 0,
    capped          bigint      NOT NULL DEFAULT 0,
    invalid         bigint      NOT NULL DEFAULT 0,
    rejected        bigint      NOT NULL DEFAULT 0,
    expired         bigint      NOT NULL DEFAULT 0,
    cancelled       bigint      NOT NULL DEFAULT 0,
    -- Also serves "a campaign's minutes in a time range".
    PRIMARY KEY (campaign_id, minute),
    CONSTRAINT delivery_minutes_whole_minute
        CHECK (date_bin('1 minute', minute, TIMESTAMPTZ '2000-01-01 00:00:00+00') = minute),
    CONSTRAINT delivery_minutes_counts_non_negative CHECK (
        sent >= 0 AND failed >= 0 AND retried >= 0 AND skipped_invalid >= 0 AND capped >= 0
        AND invalid >= 0 AND rejected >= 0 AND expired >= 0 AND cancelled >= 0)
);

-- Retention deletes old minutes across all campaigns.
CREATE INDEX delivery_minutes_minute_idx ON delivery_minutes (minute);
