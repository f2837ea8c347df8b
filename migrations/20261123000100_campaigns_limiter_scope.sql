-- Where a campaign's rate is enforced: 'local' (each worker applies the whole rate) or
-- 'redis' (the workers share it through Redis leases). NULL: the worker's configured
-- limiter.scope. The constraint's name is mapped back to the field by the store.
ALTER TABLE campaigns
    ADD COLUMN limiter_scope text,
    ADD CONSTRAINT campaigns_limiter_scope_known
        CHECK (limiter_scope IS NULL OR limiter_scope IN ('local', 'redis'));
