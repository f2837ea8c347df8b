-- Invalid tokens are scoped by the provider (its configured name) that answered, and
-- expire: a token dead for one app or environment may work through another, and
-- tokens do come back. A skip applies only to jobs sent through the same provider, and
-- only until expires_at (now() + hygiene.invalid_ttl when recorded, pushed on each
-- new answer).
--
-- Rows recorded before this migration have no provider (NULL: legacy). They were
-- recorded for 410 Unregistered, but also for APNs DeviceTokenNotForTopic and minority
-- BadDeviceToken, which do not mean dead. They keep applying to every provider, as
-- they did, but only until first_seen + 30 days (the default hygiene.invalid_ttl): a
-- legacy row that was wrong stops skipping by then, one that was right costs at most
-- one more send, whose answer records it again in its provider's scope.
ALTER TABLE invalid_tokens DROP CONSTRAINT invalid_tokens_pkey;
ALTER TABLE invalid_tokens ADD COLUMN provider text;
ALTER TABLE invalid_tokens ADD COLUMN last_seen timestamptz;
ALTER TABLE invalid_tokens ADD COLUMN expires_at timestamptz;
UPDATE invalid_tokens SET last_seen = first_seen, expires_at = first_seen + interval '30 days';
ALTER TABLE invalid_tokens ALTER COLUMN last_seen SET NOT NULL;
ALTER TABLE invalid_tokens ALTER COLUMN last_seen SET DEFAULT now();
ALTER TABLE invalid_tokens ALTER COLUMN expires_at SET NOT NULL;
ALTER TABLE invalid_tokens ADD CONSTRAINT invalid_tokens_provider_size
    CHECK (octet_length(provider) BETWEEN 1 AND 1024);

-- One row per (token, provider); the legacy rows (provider NULL) stay one per token.
-- The token hash leads, so a batched lookup by hashes uses it.
CREATE UNIQUE INDEX invalid_tokens_token_provider_key
    ON invalid_tokens (token_hash, provider) NULLS NOT DISTINCT;
-- Incremental reloads read the rows recorded (or answered again) since the last one.
DROP INDEX invalid_tokens_first_seen;
CREATE INDEX invalid_tokens_last_seen ON invalid_tokens (last_seen);
-- Pruning deletes the expired rows.
CREATE INDEX invalid_tokens_expires_at ON invalid_tokens (expires_at);
