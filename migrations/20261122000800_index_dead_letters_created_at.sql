-- Dead letters by time, across campaigns.
CREATE INDEX dead_letters_created_at_idx ON dead_letters (created_at);
