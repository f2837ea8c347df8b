-- One marker per flusher, moved forward in place by each batch's own statement: a batch
-- adds its counts only when it moves its flusher's marker forward. A late copy of an
-- older batch (sent on a connection that was lost, reaching the server after a retry
-- committed and later batches followed) then adds nothing; with one row per batch, the
-- later batches' clean-up had deleted the marker it would have found.
DELETE FROM stats_flushes f USING stats_flushes g
 WHERE f.flusher_id = g.flusher_id AND f.seq < g.seq;
CREATE UNIQUE INDEX stats_flushes_one_per_flusher ON stats_flushes (flusher_id);
