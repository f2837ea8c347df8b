-- Delivery policy (issue 56): a campaign's priority class under shared caps, its
-- ramp-up, and a finish-by deadline its rate is planned from.
--
--   priority:  critical | high | normal | bulk; a class is served strictly before the
--              ones below it under any shared cap;
--   ramp_up_s: seconds its rate takes to climb to the full rate (0: none); NULL: the
--              worker's limiter.ramp_up_s;
--   ramp_from: the fraction of the full rate a ramp starts at; NULL: limiter.ramp_from;
--   finish_by: the instant it should be done by; its send_rate is then the most it may
--              send at;
--   send_window, deliver_at_local, late_policy: the recipients' local-time rules, in
--              the zone each job states (`tz`): a window {"from","to","days"}, a local
--              time of day ('HH:MM'), and what a local time already passed does.
-- The constraints' names are mapped back to the field by the store.
ALTER TABLE campaigns
    ADD COLUMN priority text NOT NULL DEFAULT 'normal',
    ADD CONSTRAINT campaigns_priority_known
        CHECK (priority IN ('critical', 'high', 'normal', 'bulk')),
    ADD COLUMN ramp_up_s double precision,
    ADD CONSTRAINT campaigns_ramp_up_s_range
        CHECK (ramp_up_s IS NULL OR (ramp_up_s >= 0 AND ramp_up_s <= 86400)),
    ADD COLUMN ramp_from double precision,
    ADD CONSTRAINT campaigns_ramp_from_range
        CHECK (ramp_from IS NULL OR (ramp_from >= 0.01 AND ramp_from <= 1)),
    ADD COLUMN finish_by timestamptz,
    ADD COLUMN send_window text,
    ADD CONSTRAINT campaigns_send_window_object
        CHECK (send_window IS NULL OR jsonb_typeof(send_window::jsonb) = 'object'),
    ADD COLUMN deliver_at_local text,
    ADD CONSTRAINT campaigns_deliver_at_local_format
        CHECK (deliver_at_local IS NULL OR deliver_at_local ~ '^([01][0-9]|2[0-3]):[0-5][0-9]$'),
    ADD COLUMN late_policy text NOT NULL DEFAULT 'next_window',
    ADD CONSTRAINT campaigns_late_policy_known
        CHECK (late_policy IN ('send_now', 'next_window', 'skip'));

-- The settings history also records the policy fields; every field it recorded before
-- is kept.
CREATE OR REPLACE FUNCTION campaign_events_record() RETURNS trigger
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
                       to_char(NEW.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
        ('priority', o.priority, NEW.priority),
        ('ramp_up_s', o.ramp_up_s::text, NEW.ramp_up_s::text),
        ('ramp_from', o.ramp_from::text, NEW.ramp_from::text),
        ('finish_by', to_char(o.finish_by AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                      to_char(NEW.finish_by AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
        ('send_window', o.send_window, NEW.send_window),
        ('deliver_at_local', o.deliver_at_local, NEW.deliver_at_local),
        ('late_policy', o.late_policy, NEW.late_policy)
    ) AS f(field, old_value, new_value)
    WHERE f.old_value IS DISTINCT FROM f.new_value;
    RETURN NULL;
END
$$;
