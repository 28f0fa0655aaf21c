-- nexus-mcp shared state, schema 2: the head of each replica's audit log (issue 28).
--
-- Each replica writes its own hash-chained audit file; the last record's sha256 is
-- anchored here (at most once a second, and at shutdown), out of reach of whoever can
-- rewrite that replica's files: `nexus-mcp audit verify` then finds a log that was
-- truncated or rewritten, with its heads file, behind the anchor.
CREATE TABLE audit_heads (
    key_prefix  text COLLATE "C" NOT NULL,
    replica     text COLLATE "C" NOT NULL,
    log         text COLLATE "C" NOT NULL,
    last_sha256 text NOT NULL,
    anchored_at double precision NOT NULL,
    PRIMARY KEY (key_prefix, replica, log)
);
