-- Issue 17: dashboard sessions, passwords and invitations (sql/175_dashboard.sql), and the new
-- credential kinds they and delivery tokens are found by (sql/040_credentials.sql). The guard
-- triggers and the extra sign-in lookup policy are re-applied from the fresh install.

ALTER TABLE querylayer.credentials DROP CONSTRAINT credentials_kind_check;
ALTER TABLE querylayer.credentials ADD CONSTRAINT credentials_kind_check
    CHECK (kind IN ('connection', 'member_token', 'member_session', 'invitation', 'delivery_token'));

CREATE TABLE querylayer.member_invitations (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    member_id       uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    prefix          text NOT NULL,
    expires_at      timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      text NOT NULL,
    used_at         timestamptz,
    revoked_at      timestamptz,
    revoked_reason  text,
    CHECK (expires_at > created_at)
);
SELECT querylayer.isolate_by_site('querylayer.member_invitations'::regclass);
CREATE INDEX member_invitations_member ON querylayer.member_invitations (site_id, member_id);

CREATE TABLE querylayer.member_passwords (
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    member_id       uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    lookup_sha256   bytea NOT NULL UNIQUE CHECK (length(lookup_sha256) = 32),
    password_hash   text NOT NULL CHECK (password_hash LIKE '$argon2id$%'),
    set_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    invitation_id   uuid NOT NULL REFERENCES querylayer.member_invitations ON DELETE RESTRICT,
    PRIMARY KEY (site_id, member_id)
);
SELECT querylayer.isolate_by_site('querylayer.member_passwords'::regclass);

CREATE TABLE querylayer.sign_in_attempts (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    site_id   uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    member_id uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    succeeded boolean NOT NULL
);
SELECT querylayer.isolate_by_site('querylayer.sign_in_attempts'::regclass);
CREATE INDEX sign_in_attempts_member ON querylayer.sign_in_attempts (site_id, member_id, at);

CREATE TABLE querylayer.member_sessions (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    member_id       uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    prefix          text NOT NULL,
    expires_at      timestamptz NOT NULL,
    revoked_at      timestamptz,
    revoked_reason  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      text NOT NULL,
    CHECK (expires_at > created_at)
);
SELECT querylayer.isolate_by_site('querylayer.member_sessions'::regclass);
CREATE INDEX member_sessions_member ON querylayer.member_sessions (site_id, member_id);

-- The dashboard's content list pages through a site's items by their last change.
CREATE INDEX content_items_site_updated ON querylayer.content_items (site_id, updated_at DESC, id DESC);

-- The size limit of what members write into sessions (the trigger comes from the fresh install).
INSERT INTO querylayer.value_limits (table_name, column_name, argument, max_bytes) VALUES
    ('member_sessions', 'revoked_reason', 'reason', 1000);
