-- What a device's dead letter needs to be replayed, stored once per job (its letters
-- share it): the job as a message with an empty device list ("devices":[]), payload
-- verbatim, provider, options and lifecycle included. A device letter keeps its token;
-- the letter's (topic, partition, kafka_offset) finds its job here.
CREATE TABLE dead_letter_jobs (
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    kafka_offset bigint      NOT NULL,
    job          bytea       NOT NULL CHECK (octet_length(job) <= 1048576),
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, kafka_offset)
);
CREATE INDEX dead_letter_jobs_created_at ON dead_letter_jobs (created_at);
