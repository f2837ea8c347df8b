-- A campaign's weight in the fair share: under a global cap, a provider's max_rate or
-- its adaptive ceiling, a campaign with weight 3 gets three times the share of one with
-- weight 1 (weighted max-min), and never more than its send_rate.
ALTER TABLE campaigns
    ADD COLUMN weight double precision NOT NULL DEFAULT 1
        CONSTRAINT campaigns_weight_range CHECK (weight >= 0.01 AND weight <= 100);
