-- Workers LISTEN on campaign_changed and re-read the row named in the payload, so a
-- change made through the API or with plain SQL reaches them within a second.
CREATE FUNCTION campaigns_notify_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('campaign_changed', OLD.id);
        RETURN OLD;
    END IF;
    PERFORM pg_notify('campaign_changed', NEW.id);
    RETURN NEW;
END
$$;

CREATE TRIGGER campaigns_notify_changed
    AFTER INSERT OR UPDATE OR DELETE ON campaigns
    FOR EACH ROW EXECUTE FUNCTION campaigns_notify_changed();
