-- Dead letters that cannot fail on bad data and are written once per message and device.
-- Needs PostgreSQL 15 or later (UNIQUE ... NULLS NOT DISTINCT).

-- The raw Kafka key (at most 64 KiB kept) and its length as received.
ALTER TABLE dead_letters ADD COLUMN kafka_key bytea;
ALTER TABLE dead_letters ADD COLUMN kafka_key_len integer;
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_kafka_key_size
    CHECK (octet_length(kafka_key) <= 65536 AND kafka_key_len >= 0);
-- The device's index in its job (undeliverable letters); NULL for a whole message.
ALTER TABLE dead_letters ADD COLUMN device integer;
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_device_non_negative CHECK (device >= 0);

ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_kind_known;
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_kind_known
    CHECK (kind IN ('malformed_job', 'invalid_job', 'undeliverable', 'expired_offset'));

-- Existing device letters have a token but no index. Number them within their message
-- so that the unique index below holds; for these old rows the number is the order they
-- were written in, not the device's index in the job.
UPDATE dead_letters d
SET device = n.device
FROM (
    SELECT id,
           row_number() OVER (PARTITION BY topic, partition, kafka_offset ORDER BY id) - 1 AS device
    FROM dead_letters
    WHERE device IS NULL AND device_token IS NOT NULL
) n
WHERE d.id = n.id;

-- A whole message re-read after a crash may have been recorded twice: keep the first.
DELETE FROM dead_letters d
USING dead_letters k
WHERE d.device IS NULL AND k.device IS NULL
  AND k.topic = d.topic AND k.partition = d.partition AND k.kafka_offset = d.kafka_offset
  AND k.id < d.id;

-- One letter per message (device NULL) or per device of a message; inserts use
-- ON CONFLICT DO NOTHING, so a message re-read after a crash gets no second letter.
CREATE UNIQUE INDEX dead_letters_message_device_key
    ON dead_letters (topic, partition, kafka_offset, device) NULLS NOT DISTINCT;
