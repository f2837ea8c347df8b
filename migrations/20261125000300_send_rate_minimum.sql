-- The campaign bounds the code enforces, made the schema's too:
-- send_rate ≥ 0.001/s (one send every 1000 s): a slower campaign would hold its jobs,
-- and its partition's committed offset, for days.
-- burst ≤ 10000: a larger burst releases so many sends at once that the limiter no
-- longer limits.
-- Rows outside the new bounds are brought to the nearest bound first, so the
-- constraints can be added. Constraint names are mapped to fields by the store.
UPDATE campaigns SET send_rate = 0.001 WHERE send_rate < 0.001;
UPDATE campaigns SET burst = 10000 WHERE burst > 10000;
ALTER TABLE campaigns
    DROP CONSTRAINT campaigns_send_rate_range,
    -- NaN compares greater than every number in PostgreSQL, so the upper bound rejects it too.
    ADD CONSTRAINT campaigns_send_rate_range
        CHECK (send_rate >= 0.001 AND send_rate <= 10000000),
    DROP CONSTRAINT campaigns_burst_non_negative,
    ADD CONSTRAINT campaigns_burst_range CHECK (burst >= 0 AND burst <= 10000);
