-- Devices not sent by policy: tokens known invalid (skipped at intake) and devices over
-- their frequency cap. Counted per second like sent/failed/retried.
ALTER TABLE delivery_seconds
    ADD COLUMN skipped_invalid bigint NOT NULL DEFAULT 0 CHECK (skipped_invalid >= 0),
    ADD COLUMN capped          bigint NOT NULL DEFAULT 0 CHECK (capped >= 0);
