-- nexus-mcp shared state, schema 1: grants (tuples, zone revisions, profile assignments)
-- and idempotency records. Applied by `nexus-mcp state migrate` in one transaction.
--
-- Text columns of the grants tables use the "C" collation: byte order of UTF-8, which is
-- code point order, as in the SQLite store, so prefix range scans on `object` use the
-- primary key and sorted listings come out in the same order on both backends.

-- Primary key order serves list_objects: equality on zone/subject/relation, then a range
-- scan on object for the prefix.
CREATE TABLE tuples (
    zone     text COLLATE "C" NOT NULL,
    subject  text COLLATE "C" NOT NULL,
    relation text COLLATE "C" NOT NULL,
    object   text COLLATE "C" NOT NULL,
    PRIMARY KEY (zone, subject, relation, object)
);

CREATE TABLE zone_revisions (
    zone     text COLLATE "C" PRIMARY KEY,
    revision bigint NOT NULL
);

CREATE TABLE assignments (
    zone    text COLLATE "C" NOT NULL,
    subject text COLLATE "C" NOT NULL,
    profile text COLLATE "C" NOT NULL,
    PRIMARY KEY (zone, subject)
);

-- Times are the servers' wall clock in seconds since the epoch (records are shared by
-- every replica), as in the SQLite store.
CREATE TABLE idempotency_records (
    scope_key   text PRIMARY KEY,
    args_digest text NOT NULL,
    state       text NOT NULL CHECK (state IN ('pending', 'succeeded', 'unknown')),
    owner       text,
    result_json text,
    created_at  double precision NOT NULL,
    lease_until double precision NOT NULL,
    expires_at  double precision NOT NULL
);

CREATE INDEX idempotency_records_expiry ON idempotency_records (expires_at);
