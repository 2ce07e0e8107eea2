-- Issue 14: idempotency keys (sql/155_idempotency.sql).
CREATE TABLE querylayer.idempotency_keys (
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    principal_id   uuid NOT NULL,
    key            text NOT NULL CHECK (key ~ '^[!-~]{1,255}$'),
    action         text NOT NULL CHECK (length(action) BETWEEN 1 AND 200),
    request_sha256 bytea NOT NULL CHECK (length(request_sha256) = 32),
    response       jsonb,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at     timestamptz NOT NULL,
    PRIMARY KEY (site_id, principal_id, key)
);
CREATE INDEX idempotency_keys_expiry ON querylayer.idempotency_keys (site_id, expires_at);
SELECT querylayer.isolate_by_site('querylayer.idempotency_keys'::regclass);
ALTER TABLE querylayer.idempotency_keys OWNER TO querylayer_owner;
