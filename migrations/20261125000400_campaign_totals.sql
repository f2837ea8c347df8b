-- Each campaign's lifetime counts, so that reading them is one index lookup instead of a
-- sum over all its seconds. Statement-level triggers on delivery_seconds keep them in the
-- flush's own transaction: one aggregate upsert per statement, not one per row.
--
-- Two rows per campaign: from_update = false holds the counts of seconds as first
-- inserted, true the increments added to existing seconds. An INSERT .. ON CONFLICT DO
-- UPDATE fires both statement triggers one after the other; with a single row per
-- campaign, two flushes could each lock one campaign's row in the first trigger and wait
-- for the other's in the second (a deadlock). With the rows split, every transaction
-- locks delivery_seconds rows, then "update" rows, then "insert" rows, each group in
-- campaign order, so the waits cannot form a cycle. Readers sum the two rows.
--
-- Deleting seconds (retention) leaves the totals alone: they are lifetime counts, so
-- there is no DELETE trigger.
CREATE TABLE campaign_totals (
    campaign_id     text    NOT NULL,
    from_update     boolean NOT NULL,
    sent            bigint  NOT NULL DEFAULT 0,
    failed          bigint  NOT NULL DEFAULT 0,
    retried         bigint  NOT NULL DEFAULT 0,
    skipped_invalid bigint  NOT NULL DEFAULT 0,
    capped          bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (campaign_id, from_update)
);

CREATE FUNCTION campaign_totals_add_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO campaign_totals AS t
        (campaign_id, from_update, sent, failed, retried, skipped_invalid, capped)
    SELECT n.campaign_id, false, sum(n.sent), sum(n.failed), sum(n.retried),
           sum(n.skipped_invalid), sum(n.capped)
    FROM inserted_seconds n
    GROUP BY n.campaign_id
    ORDER BY n.campaign_id
    ON CONFLICT (campaign_id, from_update) DO UPDATE SET
        sent = t.sent + EXCLUDED.sent,
        failed = t.failed + EXCLUDED.failed,
        retried = t.retried + EXCLUDED.retried,
        skipped_invalid = t.skipped_invalid + EXCLUDED.skipped_invalid,
        capped = t.capped + EXCLUDED.capped;
    RETURN NULL;
END
$$;

-- New minus old, grouped by each side's own campaign_id, so that an UPDATE moving a row
-- to another campaign is counted right too.
CREATE FUNCTION campaign_totals_add_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO campaign_totals AS t
        (campaign_id, from_update, sent, failed, retried, skipped_invalid, capped)
    SELECT d.campaign_id, true, sum(d.sent), sum(d.failed), sum(d.retried),
           sum(d.skipped_invalid), sum(d.capped)
    FROM (
        SELECT campaign_id, sent, failed, retried, skipped_invalid, capped
        FROM updated_seconds_new
        UNION ALL
        SELECT campaign_id, -sent, -failed, -retried, -skipped_invalid, -capped
        FROM updated_seconds_old
    ) d
    GROUP BY d.campaign_id
    ORDER BY d.campaign_id
    ON CONFLICT (campaign_id, from_update) DO UPDATE SET
        sent = t.sent + EXCLUDED.sent,
        failed = t.failed + EXCLUDED.failed,
        retried = t.retried + EXCLUDED.retried,
        skipped_invalid = t.skipped_invalid + EXCLUDED.skipped_invalid,
        capped = t.capped + EXCLUDED.capped;
    RETURN NULL;
END
$$;

-- Writers wait from here until this migration commits, so the back-fill below and the
-- triggers together count every row exactly once.
LOCK TABLE delivery_seconds IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER campaign_totals_add_inserted
    AFTER INSERT ON delivery_seconds
    REFERENCING NEW TABLE AS inserted_seconds
    FOR EACH STATEMENT EXECUTE FUNCTION campaign_totals_add_inserted();

CREATE TRIGGER campaign_totals_add_updated
    AFTER UPDATE ON delivery_seconds
    REFERENCING OLD TABLE AS updated_seconds_old NEW TABLE AS updated_seconds_new
    FOR EACH STATEMENT EXECUTE FUNCTION campaign_totals_add_updated();

INSERT INTO campaign_totals (campaign_id, from_update, sent, failed, retried, skipped_invalid, capped)
SELECT campaign_id, false, sum(sent), sum(failed), sum(retried), sum(skipped_invalid), sum(capped)
FROM delivery_seconds
GROUP BY campaign_id;

-- The campaign watcher re-reads only the rows changed since its last read.
CREATE INDEX campaigns_updated_at_idx ON campaigns (updated_at);
