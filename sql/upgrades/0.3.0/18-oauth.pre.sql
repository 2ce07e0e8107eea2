-- Issue 18: OAuth 2.1 for MCP clients (sql/190_oauth.sql): registered clients, authorization
-- codes, grants and refresh tokens. Before the functions, whose signatures name the row types of
-- the codes and grants. Guard triggers and the lookup policies are re-applied from the fresh
-- install.

-- A client registered through dynamic client registration (RFC 7591). Public clients only (no
-- client secret): PKCE binds the code to the client that asked for it.
CREATE TABLE querylayer.oauth_clients (
    client_id     text PRIMARY KEY CHECK (client_id ~ '^qlo_[0-9a-f]{32}$'),
    client_name   text NOT NULL CHECK (client_name ~ '^[^[:cntrl:]]{1,120}$'),
    redirect_uris text[] NOT NULL CHECK (cardinality(redirect_uris) BETWEEN 1 AND 8),
    created_at    timestamptz NOT NULL DEFAULT now()
);
SELECT querylayer.make_append_only('querylayer.oauth_clients'::regclass);

-- An authorization code: what the member consented to, bound to the client, the redirect URI,
-- the PKCE challenge (S256) and the resource. Single use, sixty seconds.
CREATE TABLE querylayer.oauth_codes (
    code_sha256     bytea PRIMARY KEY CHECK (length(code_sha256) = 32),
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    client_id       text NOT NULL REFERENCES querylayer.oauth_clients ON DELETE RESTRICT,
    redirect_uri    text NOT NULL CHECK (length(redirect_uri) <= 512),
    code_challenge  text NOT NULL CHECK (code_challenge ~ '^[A-Za-z0-9_-]{43}$'),
    resource        text NOT NULL CHECK (length(resource) <= 512),
    member_id       uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    agent_id        uuid NOT NULL REFERENCES querylayer.agents ON DELETE RESTRICT,
    scopes          text[] NOT NULL CHECK (cardinality(scopes) > 0),
    grant_expires_at timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL DEFAULT now() + interval '60 seconds',
    used_at         timestamptz,
    grant_id        uuid,
    CHECK (expires_at <= created_at + interval '10 minutes')
);
SELECT querylayer.isolate_by_site('querylayer.oauth_codes'::regclass);

-- A grant: one member's consent for one client, alive until it expires or is revoked. Its
-- connection is the one whose secret is the current access token.
CREATE TABLE querylayer.oauth_grants (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    client_id       text NOT NULL REFERENCES querylayer.oauth_clients ON DELETE RESTRICT,
    member_id       uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    agent_id        uuid NOT NULL REFERENCES querylayer.agents ON DELETE RESTRICT,
    scopes          text[] NOT NULL CHECK (cardinality(scopes) > 0),
    resource        text NOT NULL,
    connection_id   uuid NOT NULL REFERENCES querylayer.connections ON DELETE RESTRICT,
    generation      integer NOT NULL DEFAULT 1 CHECK (generation > 0),
    expires_at      timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    revoked_at      timestamptz,
    revoked_reason  text
);
SELECT querylayer.isolate_by_site('querylayer.oauth_grants'::regclass);

-- Refresh tokens: one live per grant; a spent one presented again revokes the grant.
CREATE TABLE querylayer.oauth_refresh_tokens (
    token_sha256    bytea PRIMARY KEY CHECK (length(token_sha256) = 32),
    grant_id        uuid NOT NULL REFERENCES querylayer.oauth_grants ON DELETE RESTRICT,
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    created_at      timestamptz NOT NULL DEFAULT now(),
    spent_at        timestamptz
);
SELECT querylayer.isolate_by_site('querylayer.oauth_refresh_tokens'::regclass);
CREATE INDEX oauth_refresh_tokens_grant ON querylayer.oauth_refresh_tokens (grant_id);
SELECT pg_catalog.pg_extension_config_dump('querylayer.oauth_clients'::regclass, '');
SELECT pg_catalog.pg_extension_config_dump('querylayer.oauth_codes'::regclass, '');
SELECT pg_catalog.pg_extension_config_dump('querylayer.oauth_grants'::regclass, '');
SELECT pg_catalog.pg_extension_config_dump('querylayer.oauth_refresh_tokens'::regclass, '');
