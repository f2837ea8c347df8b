-- Jobs name their app (issue 55).

-- A deleted app's jobs are dead-lettered as `unknown_app`, one letter per job with the
-- job kept whole.
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_kind_known;
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_kind_known
    CHECK (kind IN ('malformed_job', 'invalid_job', 'undeliverable', 'expired_offset',
                    'expired', 'unknown_app'));

-- The app a held campaign's next sends go through, as each worker publishes it.
ALTER TABLE worker_campaigns ADD COLUMN app_id text;
CREATE INDEX worker_campaigns_app_idx ON worker_campaigns (app_id) WHERE app_id IS NOT NULL;

-- The campaigns that send through `app` now: held with devices to send by a worker that
-- published within the last 5 s (store::worker_campaigns::FRESH_S). DELETE of an app is
-- refused while this is above 0, unless forced.
CREATE OR REPLACE FUNCTION app_sending_campaigns(app text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(DISTINCT campaign_id) FROM worker_campaigns
    WHERE app_id = app AND held > 0 AND updated_at > now() - interval '5 seconds'
$$;
