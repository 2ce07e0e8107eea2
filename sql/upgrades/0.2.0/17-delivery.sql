-- Issue 17: the delivery API's tokens and per-site settings (sql/180_delivery.sql), and the index
-- that dates a site's last live-set change. Guard triggers and the public lookup policy are
-- re-applied from the fresh install.

CREATE TABLE querylayer.delivery_tokens (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    name            text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9 ._:@-]{0,79}$'),
    prefix          text NOT NULL,
    expires_at      timestamptz NOT NULL,
    revoked_at      timestamptz,
    revoked_reason  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      text NOT NULL,
    CHECK (expires_at > created_at)
);
SELECT querylayer.isolate_by_site('querylayer.delivery_tokens'::regclass);

CREATE TABLE querylayer.delivery_settings (
    site_id         uuid PRIMARY KEY REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    site_sha256     bytea NOT NULL UNIQUE CHECK (length(site_sha256) = 32),
    public          boolean NOT NULL DEFAULT false,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    updated_by      text NOT NULL
);
SELECT querylayer.isolate_by_site('querylayer.delivery_settings'::regclass);

CREATE INDEX proposal_executions_site_executed ON querylayer.proposal_executions (site_id, executed_at);

-- The size limit of what members write into delivery tokens (the trigger comes from the fresh install).
INSERT INTO querylayer.value_limits (table_name, column_name, argument, max_bytes) VALUES
    ('delivery_tokens', 'revoked_reason', 'reason', 1000);
