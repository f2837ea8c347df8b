-- Dead letters of one campaign, newest first (ids grow with insertion time), paged by id.
CREATE INDEX dead_letters_campaign_id_idx ON dead_letters (campaign_id, id DESC);
