-- Messages and devices that could not be processed, with a reason a person can act on.
CREATE TABLE dead_letters (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind         text        NOT NULL,
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    kafka_offset bigint      NOT NULL,
    campaign_id  text,
    job_id       text,
    device_token text,
    reason       text        NOT NULL,
    raw          bytea       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT dead_letters_kind_known CHECK (kind IN ('malformed_job', 'invalid_job', 'undeliverable')),
    CONSTRAINT dead_letters_raw_size CHECK (octet_length(raw) <= 1048576)
);
