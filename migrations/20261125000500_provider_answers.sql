-- Provider answers (issue 20): a campaign halted by a configuration error the provider
-- reported, and the per-second counts of two more answer classes.
--   invalid:  the provider said the token is dead (recorded in invalid_tokens);
--   rejected: permanent for that device only (dead-lettered with the provider's reason).
-- `failed` keeps counting devices dead-lettered after their retries ran out.
ALTER TABLE campaigns DROP CONSTRAINT campaigns_status_known;
ALTER TABLE campaigns
    ADD CONSTRAINT campaigns_status_known CHECK (status IN ('active', 'paused', 'done', 'halted')),
    ADD COLUMN halt_reason text,
    ADD COLUMN halted_at timestamptz,
    ADD CONSTRAINT campaigns_halt_reason_length CHECK (char_length(halt_reason) <= 1000);

ALTER TABLE delivery_seconds
    ADD COLUMN invalid  bigint NOT NULL DEFAULT 0 CHECK (invalid >= 0),
    ADD COLUMN rejected bigint NOT NULL DEFAULT 0 CHECK (rejected >= 0);

ALTER TABLE campaign_totals
    ADD COLUMN invalid  bigint NOT NULL DEFAULT 0,
    ADD COLUMN rejected bigint NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION campaign_totals_add_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO campaign_totals AS t
        (campaign_id, from_update, sent, failed, retried, skipped_invalid, capped, invalid, rejected)
    SELECT n.campaign_id, false, sum(n.sent), sum(n.failed), sum(n.retried),
           sum(n.skipped_invalid), sum(n.capped), sum(n.invalid), sum(n.rejected)
    FROM inserted_seconds n
    GROUP BY n.campaign_id
    ORDER BY n.campaign_id
    ON CONFLICT (campaign_id, from_update) DO UPDATE SET
        sent = t.sent + EXCLUDED.sent,
        failed = t.failed + EXCLUDED.failed,
        retried = t.retried + EXCLUDED.retried,
        skipped_invalid = t.skipped_invalid + EXCLUDED.skipped_invalid,
        capped = t.capped + EXCLUDED.capped,
        invalid = t.invalid + EXCLUDED.invalid,
        rejected = t.rejected + EXCLUDED.rejected;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION campaign_totals_add_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO campaign_totals AS t
        (campaign_id, from_update, sent, failed, retried, skipped_invalid, capped, invalid, rejected)
    SELECT d.campaign_id, true, sum(d.sent), sum(d.failed), sum(d.retried),
           sum(d.skipped_invalid), sum(d.capped), sum(d.invalid), sum(d.rejected)
    FROM (
        SELECT campaign_id, sent, failed, retried, skipped_invalid, capped, invalid, rejected
        FROM updated_seconds_new
        UNION ALL
        SELECT campaign_id, -sent, -failed, -retried, -skipped_invalid, -capped, -invalid, -rejected
        FROM updated_seconds_old
    ) d
    GROUP BY d.campaign_id
    ORDER BY d.campaign_id
    ON CONFLICT (campaign_id, from_update) DO UPDATE SET
        sent = t.sent + EXCLUDED.sent,
        failed = t.failed + EXCLUDED.failed,
        retried = t.retried + EXCLUDED.retried,
        skipped_invalid = t.skipped_invalid + EXCLUDED.skipped_invalid,
        capped = t.capped + EXCLUDED.capped,
        invalid = t.invalid + EXCLUDED.invalid,
        rejected = t.rejected + EXCLUDED.rejected;
    RETURN NULL;
END
$$;
