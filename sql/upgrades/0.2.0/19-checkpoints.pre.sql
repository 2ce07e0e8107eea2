-- 0.2.0: the signed checkpoints of every site's ledger (sql/185_checkpoints.sql, docs/ledger.md).
-- Before the functions, whose signatures name its row type.

CREATE TABLE querylayer.ledger_checkpoints (
    site_id           uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    seq               bigint NOT NULL CHECK (seq > 0),
    head_sha256       bytea NOT NULL CHECK (length(head_sha256) = 32),
    tree_root         bytea NOT NULL CHECK (length(tree_root) = 32),
    checkpointed_at   timestamptz NOT NULL,
    prev_sha256       bytea CHECK (length(prev_sha256) = 32),
    checkpoint_sha256 bytea NOT NULL UNIQUE CHECK (length(checkpoint_sha256) = 32),
    server_key_id     uuid NOT NULL REFERENCES querylayer.server_keys ON DELETE RESTRICT,
    signature         text NOT NULL,
    -- The roots of the tree's perfect subtrees (largest first, 32 bytes each, end to end): the
    -- next checkpoint extends the tree from here. Not signed; a wrong frontier only makes wrong
    -- checkpoints, which fail.
    frontier          bytea NOT NULL CHECK (length(frontier) % 32 = 0),
    PRIMARY KEY (site_id, seq),
    -- One successor per checkpoint, one first checkpoint per site.
    UNIQUE NULLS NOT DISTINCT (site_id, prev_sha256)
);
SELECT querylayer.isolate_by_site('querylayer.ledger_checkpoints'::regclass);
SELECT querylayer.make_append_only('querylayer.ledger_checkpoints'::regclass);
