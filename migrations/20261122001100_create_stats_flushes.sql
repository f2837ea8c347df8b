-- One marker per committed stats flush batch, written in the batch's own transaction.
-- When a COMMIT's outcome is unknown (connection lost mid-commit), the retry finds the
-- marker and skips the counts instead of adding them twice. A flusher deletes its older
-- markers as it goes; retention removes those of flushers that are gone.
CREATE TABLE stats_flushes (
    flusher_id   text        NOT NULL,
    seq          bigint      NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (flusher_id, seq)
);
