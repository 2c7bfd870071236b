-- Publishing dead letters to `dead_letter.topic` never blocks a partition: the row is stored
-- first (its offset then resolves) and a background relay publishes it. These columns say
-- where it is to go and how publishing went, so a failure is visible and can be retried.
-- The topic the letter is to be published to; NULL when no dead-letter topic was configured.
ALTER TABLE dead_letters ADD COLUMN publish_to text;
-- Failed attempts to publish, and the last failure's reason (cleared once published).
ALTER TABLE dead_letters ADD COLUMN publish_attempts integer NOT NULL DEFAULT 0;
ALTER TABLE dead_letters ADD COLUMN publish_error text;
-- What the relay scans: letters still to publish.
CREATE INDEX dead_letters_publish_pending ON dead_letters (publish_to, first_seen)
    WHERE publish_to IS NOT NULL AND published_at IS NULL;
