-- Retention deletes old seconds across all campaigns.
CREATE INDEX delivery_seconds_second_idx ON delivery_seconds (second);
