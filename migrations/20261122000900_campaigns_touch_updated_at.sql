-- Keep updated_at true even when a row is changed with plain SQL.
CREATE FUNCTION campaigns_touch_updated_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

CREATE TRIGGER campaigns_touch_updated_at
    BEFORE UPDATE ON campaigns
    FOR EACH ROW EXECUTE FUNCTION campaigns_touch_updated_at();
