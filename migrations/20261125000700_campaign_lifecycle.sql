-- Campaign lifecycle (issue 23): a start time, an expiry, a final cancel, the per-second
-- counts of devices expired or cancelled, and a history of settings changes.
--
--   start_at:   nothing of the campaign is sent before it;
--   expires_at: devices not sent by then are counted `expired` (one dead letter per job);
--   cancelled:  final (pause is the reversible stop); the rest is counted `cancelled`.
ALTER TABLE campaigns DROP CONSTRAINT campaigns_status_known;
ALTER TABLE campaigns
    ADD CONSTRAINT campaigns_status_known
        CHECK (status IN ('active', 'paused', 'done', 'halted', 'cancelled')),
    ADD COLUMN start_at timestamptz,
    ADD COLUMN expires_at timestamptz,
    ADD CONSTRAINT campaigns_expires_after_start
        CHECK (start_at IS NULL OR expires_at IS NULL OR expires_at > start_at);

ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_kind_known;
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_kind_known
    CHECK (kind IN ('malformed_job', 'invalid_job', 'undeliverable', 'expired_offset', 'expired'));

ALTER TABLE delivery_seconds
    ADD COLUMN expired   bigint NOT NULL DEFAULT 0 CHECK (expired >= 0),
    ADD COLUMN cancelled bigint NOT NULL DEFAULT 0 CHECK (cancelled >= 0);

ALTER TABLE campaign_totals
    ADD COLUMN expired   bigint NOT NULL DEFAULT 0,
    ADD COLUMN cancelled bigint NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION campaign_totals_add_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO campaign_totals AS t
        (campaign_id, from_update, sent, failed, retried, skipped_invalid, capped, invalid,
         rejected, expired, cancelled)
    SELECT n.campaign_id, false, sum(n.sent), sum(n.failed), sum(n.retried),
           sum(n.skipped_invalid), sum(n.capped), sum(n.invalid), sum(n.rejected),
           sum(n.expired), sum(n.cancelled)
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
        rejected = t.rejected + EXCLUDED.rejected,
        expired = t.expired + EXCLUDED.expired,
        cancelled = t.cancelled + EXCLUDED.cancelled;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION campaign_totals_add_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO campaign_totals AS t
        (campaign_id, from_update, sent, failed, retried, skipped_invalid, capped, invalid,
         rejected, expired, cancelled)
    SELECT d.campaign_id, true, sum(d.sent), sum(d.failed), sum(d.retried),
           sum(d.skipped_invalid), sum(d.capped), sum(d.invalid), sum(d.rejected),
           sum(d.expired), sum(d.cancelled)
    FROM (
        SELECT campaign_id, sent, failed, retried, skipped_invalid, capped, invalid, rejected,
               expired, cancelled
        FROM updated_seconds_new
        UNION ALL
        SELECT campaign_id, -sent, -failed, -retried, -skipped_invalid, -capped, -invalid,
               -rejected, -expired, -cancelled
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
        rejected = t.rejected + EXCLUDED.rejected,
        expired = t.expired + EXCLUDED.expired,
        cancelled = t.cancelled + EXCLUDED.cancelled;
    RETURN NULL;
END
$$;

-- Every change of a campaign's send_rate, weight, status, algorithm, start or expiry,
-- with who made it: the API sets `pushpace.actor` for its transaction; anything else
-- (a job creating the campaign, a provider halting it) is recorded as 'worker'.
CREATE TABLE campaign_events (
    id          bigserial   PRIMARY KEY,
    campaign_id text        NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL,
    field       text        NOT NULL,
    old_value   text,
    new_value   text,
    CONSTRAINT campaign_events_actor_length CHECK (char_length(actor) <= 200)
);
CREATE INDEX campaign_events_campaign_at_idx ON campaign_events (campaign_id, at, id);

CREATE FUNCTION campaign_events_record() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    who text := COALESCE(NULLIF(current_setting('pushpace.actor', true), ''), 'worker');
    o   campaigns;
BEGIN
    IF TG_OP = 'INSERT' THEN
        o := NULL;
    ELSE
        o := OLD;
    END IF;
    INSERT INTO campaign_events (campaign_id, actor, field, old_value, new_value)
    SELECT NEW.id, who, f.field, f.old_value, f.new_value
    FROM (VALUES
        ('send_rate', o.send_rate::text, NEW.send_rate::text),
        ('weight', o.weight::text, NEW.weight::text),
        ('status', o.status, NEW.status),
        ('algorithm', o.algorithm, NEW.algorithm),
        ('start_at', to_char(o.start_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                     to_char(NEW.start_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
        ('expires_at', to_char(o.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                       to_char(NEW.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'))
    ) AS f(field, old_value, new_value)
    WHERE f.old_value IS DISTINCT FROM f.new_value;
    RETURN NULL;
END
$$;

CREATE TRIGGER campaign_events_record
    AFTER INSERT OR UPDATE ON campaigns
    FOR EACH ROW EXECUTE FUNCTION campaign_events_record();
