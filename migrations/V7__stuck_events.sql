-- Events the database rejects by themselves, as the replica retrying each reports it (written at
-- each retry, removed once the event is written), and the operator's request to set one aside
-- (`history-service dead-letters set-aside`): the database is the channel between the two, so
-- no replica needs a port of its own and any number of them can run. The replica that holds the
-- partition stores the event as a dead letter (reason `set_aside`) at its next retry and says
-- so in `resolved_by`/`resolved_at`.
CREATE TABLE stuck_events (
    topic            text        NOT NULL,
    partition        integer     NOT NULL,
    "offset"         bigint      NOT NULL,
    event_id         text        NOT NULL,
    sqlstate         text        NOT NULL,
    error            text        NOT NULL,
    replica          text        NOT NULL,
    stuck_since      timestamptz NOT NULL DEFAULT now(),
    last_retry_at    timestamptz NOT NULL DEFAULT now(),
    set_aside_by     text,
    set_aside_reason text,
    set_aside_at     timestamptz,
    resolved_by      text,
    resolved_at      timestamptz,
    PRIMARY KEY (topic, partition, "offset")
);
