-- Job progress keyed by (campaign_id, job_id): a job_id reused by another campaign gets
-- its own row instead of inheriting the first campaign's devices_done. Existing rows are
-- kept (job_id was unique, so the new key is too).
ALTER TABLE job_progress DROP CONSTRAINT job_progress_pkey;
ALTER TABLE job_progress ADD CONSTRAINT job_progress_pkey PRIMARY KEY (campaign_id, job_id);

-- The devices finished beyond the contiguous prefix: bit k set means device
-- devices_done + k is finished. One device retrying no longer pins what is stored.
ALTER TABLE job_progress ADD COLUMN done_after bit varying NOT NULL DEFAULT B'';
ALTER TABLE job_progress ADD CONSTRAINT job_progress_done_after_range
    CHECK (devices_done + length(done_after) <= devices_total);

-- The union of two finished sets (prefix p, then bitmap b from device p), normalised:
-- leading ones move into the prefix and trailing zeros are dropped. Every set written
-- holds only finished devices, so the union is right whatever order writers commit in.
CREATE FUNCTION job_progress_union(
    p0 integer, b0 bit varying, p1 integer, b1 bit varying,
    OUT devices_done integer, OUT done_after bit varying)
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    WITH rebased AS (
        SELECT GREATEST(p0, p1) AS p,
               substring(b0 FROM GREATEST(p0, p1) - p0 + 1) AS r0,
               substring(b1 FROM GREATEST(p0, p1) - p1 + 1) AS r1
    ), merged AS (
        SELECT p,
               CASE WHEN length(r0) >= length(r1)
                    THEN r0 | (r1 || repeat('0', length(r0) - length(r1))::bit varying)
                    ELSE (r0 || repeat('0', length(r1) - length(r0))::bit varying) | r1
               END AS b
        FROM rebased
    ), trimmed AS (
        SELECT p, rtrim(b::text, '0') AS t FROM merged
    )
    SELECT p + CASE WHEN position('0' IN t) = 0 THEN length(t) ELSE position('0' IN t) - 1 END,
           CASE WHEN position('0' IN t) = 0 THEN B''
                ELSE substring(t FROM position('0' IN t))::bit varying END
    FROM trimmed
$$;

-- The offsets committed to Kafka per topic and partition (the next offset to consume),
-- recorded after each commit: retention keeps a completed job's progress until its
-- offset is behind the commit, since a re-delivered job must still find it.
CREATE TABLE committed_offsets (
    topic            text        NOT NULL,
    partition        integer     NOT NULL,
    committed_offset bigint      NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition)
);
