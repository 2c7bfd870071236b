-- Records that can never become a history row (not JSON, missing fields, bad timestamp,
-- tombstones, oversized). Kept with their coordinates and raw bytes so nothing is silently
-- dropped; unique per record, so a redelivery adds nothing.
CREATE TABLE dead_letters (
    topic            text        NOT NULL,
    partition        integer     NOT NULL,
    "offset"         bigint      NOT NULL,
    record_key       bytea,
    payload          bytea,
    -- Stable code of the reason (`not_json`, `missing_field`, ...), for grouping and alerts.
    reason_code      text        NOT NULL,
    -- The full reason, naming the field and the cause.
    reason           text        NOT NULL,
    field            text,
    record_timestamp timestamptz,
    first_seen       timestamptz NOT NULL DEFAULT now(),
    -- Set by `history-service dead-letters replay` when the record was republished.
    replayed_at      timestamptz,
    PRIMARY KEY (topic, partition, "offset")
);

CREATE INDEX dead_letters_reason_code ON dead_letters (reason_code);
