-- The app registry (issue 55): customer apps, each with its own credentials per
-- provider kind, the secret part sealed with AES-256-GCM under a master key that only
-- the processes hold (src/apps/crypto.rs). What is stored in clear is what the API may
-- show: the fingerprint and the non-secret settings.
CREATE TABLE apps (
    id         text        PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- The job format's id rule (src/job: check_id), so that a job can name it.
    CONSTRAINT apps_id_rule CHECK (id ~ '^[A-Za-z0-9._:-]{1,128}$')
);

CREATE TABLE app_credentials (
    app_id        text        NOT NULL REFERENCES apps (id) ON DELETE CASCADE,
    kind          text        NOT NULL,
    -- The id of the master key that sealed the row (first 8 hex of its SHA-256).
    master_key_id text        NOT NULL,
    nonce         bytea       NOT NULL,
    ciphertext    bytea       NOT NULL,
    fingerprint   text        NOT NULL,
    settings      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status        text        NOT NULL DEFAULT 'active',
    halted_reason text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (app_id, kind),
    CONSTRAINT app_credentials_kind CHECK (kind IN ('apns', 'fcm', 'webpush')),
    CONSTRAINT app_credentials_status CHECK (status IN ('active', 'disabled', 'halted')),
    -- A halt always says why; nothing else carries a reason.
    CONSTRAINT app_credentials_halted_reason
        CHECK ((status = 'halted') = (halted_reason IS NOT NULL)),
    CONSTRAINT app_credentials_master_key_id CHECK (master_key_id ~ '^[0-9a-f]{8}$'),
    -- AES-GCM's 96-bit nonce; the ciphertext holds at least the 16-byte tag.
    CONSTRAINT app_credentials_nonce CHECK (octet_length(nonce) = 12),
    CONSTRAINT app_credentials_ciphertext CHECK (octet_length(ciphertext) >= 16),
    CONSTRAINT app_credentials_settings CHECK (jsonb_typeof(settings) = 'object')
);
-- Rotation looks for the rows not yet under the current key.
CREATE INDEX app_credentials_master_key_idx ON app_credentials (master_key_id);

-- Keep updated_at true even when a row is changed with plain SQL.
CREATE FUNCTION apps_touch_updated_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

CREATE TRIGGER apps_touch_updated_at
    BEFORE UPDATE ON apps
    FOR EACH ROW EXECUTE FUNCTION apps_touch_updated_at();
CREATE TRIGGER app_credentials_touch_updated_at
    BEFORE UPDATE ON app_credentials
    FOR EACH ROW EXECUTE FUNCTION apps_touch_updated_at();

-- Every change of an app, with who made it (the API sets `pushpace.actor` for its
-- transaction, as for campaign_events; anything else is 'worker'). No secret is ever
-- written here: only fingerprints, master key ids, settings and statuses.
CREATE TABLE app_events (
    id        bigserial   PRIMARY KEY,
    app_id    text        NOT NULL,
    -- apns, fcm or webpush; NULL for the app itself (created, deleted).
    kind      text,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text        NOT NULL,
    field     text        NOT NULL,
    old_value text,
    new_value text,
    CONSTRAINT app_events_actor_length CHECK (char_length(actor) <= 200)
);
CREATE INDEX app_events_app_at_idx ON app_events (app_id, at, id);

CREATE FUNCTION app_events_record_app() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    who text := COALESCE(NULLIF(current_setting('pushpace.actor', true), ''), 'worker');
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO app_events (app_id, kind, actor, field, old_value, new_value)
        VALUES (NEW.id, NULL, who, 'app', NULL, 'created');
        PERFORM pg_notify('app_changed', NEW.id);
        RETURN NULL;
    END IF;
    INSERT INTO app_events (app_id, kind, actor, field, old_value, new_value)
    VALUES (OLD.id, NULL, who, 'app', 'created', 'deleted');
    PERFORM pg_notify('app_changed', OLD.id);
    RETURN NULL;
END
$$;

CREATE TRIGGER app_events_record_app
    AFTER INSERT OR DELETE ON apps
    FOR EACH ROW EXECUTE FUNCTION app_events_record_app();

-- One event per changed field of a credentials row: on insert every field from NULL, on
-- delete every field to NULL. A re-sealed secret with the same fingerprint and key
-- (the same credentials put again) records nothing; its NOTIFY still goes out.
CREATE FUNCTION app_events_record_credentials() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    who text := COALESCE(NULLIF(current_setting('pushpace.actor', true), ''), 'worker');
    o   app_credentials;
    n   app_credentials;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        o := OLD;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        n := NEW;
    END IF;
    INSERT INTO app_events (app_id, kind, actor, field, old_value, new_value)
    SELECT COALESCE(n.app_id, o.app_id), COALESCE(n.kind, o.kind), who,
           f.field, f.old_value, f.new_value
    FROM (VALUES
        ('fingerprint', o.fingerprint, n.fingerprint),
        ('master_key_id', o.master_key_id, n.master_key_id),
        ('settings', o.settings::text, n.settings::text),
        ('status', o.status, n.status),
        ('halted_reason', o.halted_reason, n.halted_reason)
    ) AS f(field, old_value, new_value)
    WHERE f.old_value IS DISTINCT FROM f.new_value;
    PERFORM pg_notify('app_changed', COALESCE(n.app_id, o.app_id));
    RETURN NULL;
END
$$;

CREATE TRIGGER app_events_record_credentials
    AFTER INSERT OR UPDATE OR DELETE ON app_credentials
    FOR EACH ROW EXECUTE FUNCTION app_events_record_credentials();

-- The campaigns that still send through an app: DELETE /api/apps/{id} is refused while
-- this is above 0, unless forced. No campaign names an app yet (jobs cannot carry
-- app_id), so it is 0; the migration that adds the app to campaigns replaces this body
-- with the real count (CREATE OR REPLACE), and the callers stay as they are.
CREATE FUNCTION app_sending_campaigns(app text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT 0::bigint
$$;
