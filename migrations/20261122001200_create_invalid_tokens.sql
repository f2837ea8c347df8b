-- Device tokens the provider answered "gone for good" (HTTP 410). Only the SHA-256 of
-- the token is kept. Workers load the table into a Bloom filter at start and re-read
-- the rows newer than their last reload (hence the first_seen index).
CREATE TABLE invalid_tokens (
    token_hash bytea       PRIMARY KEY CHECK (octet_length(token_hash) = 32),
    reason     text        NOT NULL,
    first_seen timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX invalid_tokens_first_seen ON invalid_tokens (first_seen);
