-- OAuth 2.1 for MCP clients (docs/security.md, "OAuth"): registered clients, authorization
-- codes, grants and their rotating refresh tokens. The edge is the authorization server; the
-- database decides every step. A member's consent writes a code; redeeming the code (with the
-- PKCE verifier, at the same redirect URI, for the same resource) creates a connection through
-- querylayer.issue_connection, so the access token IS that connection's secret: prefix plus
-- fingerprint, the same scope checks, revocation and audit as every connection. Codes and
-- refresh tokens are stored as their SHA-256 only, like every credential.

-- The URL of a Client ID Metadata Document, as a client_id: https, a host, a path that is not
-- the root, no fragment, user info, query or white space, at most 512 characters.
CREATE FUNCTION querylayer.oauth_document_url_valid(p_url text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN p_url IS NOT NULL AND length(p_url) <= 512 AND p_url !~ '[[:space:][:cntrl:]#?@]'
       AND p_url ~ '^https://[A-Za-z0-9.-]+(:[0-9]{1,5})?/[^/].*$';
END
$$;

-- A client: registered through dynamic client registration (RFC 7591, a qlo_ id), or named by
-- the https URL of its Client ID Metadata Document (the row records the first document the edge
-- fetched; oauth_client_documents holds every version since). Public clients only (no client
-- secret): PKCE binds the code to the client that asked for it.
CREATE TABLE querylayer.oauth_clients (
    client_id     text PRIMARY KEY CHECK (client_id ~ '^qlo_[0-9a-f]{32}$' OR querylayer.oauth_document_url_valid(client_id)),
    client_name   text NOT NULL CHECK (client_name ~ '^[^[:cntrl:]]{1,120}$'),
    redirect_uris text[] NOT NULL CHECK (cardinality(redirect_uris) BETWEEN 1 AND 8),
    created_at    timestamptz NOT NULL DEFAULT now()
);
SELECT querylayer.make_append_only('querylayer.oauth_clients'::regclass);

-- Each version of a Client ID Metadata Document the edge fetched (its name and redirect URIs as
-- the document said, and the document's SHA-256): the newest one is what the client may do now.
-- Append-only: what a client claimed, and when, stays on record.
CREATE TABLE querylayer.oauth_client_documents (
    client_id       text NOT NULL REFERENCES querylayer.oauth_clients ON DELETE RESTRICT,
    fetched_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    document_sha256 bytea NOT NULL CHECK (length(document_sha256) = 32),
    client_name     text NOT NULL CHECK (client_name ~ '^[^[:cntrl:]]{1,120}$'),
    redirect_uris   text[] NOT NULL CHECK (cardinality(redirect_uris) BETWEEN 1 AND 8),
    PRIMARY KEY (client_id, fetched_at)
);
SELECT querylayer.make_append_only('querylayer.oauth_client_documents'::regclass);

-- An authorization code: what the member consented to, bound to the client, the redirect URI,
-- the PKCE challenge (S256) and the resource. Single use, for oauth_code_ttl_seconds (60).
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
-- The token endpoint has no context yet: the extension shows it the one code it presents.
CREATE POLICY oauth_code_lookup ON querylayer.oauth_codes FOR SELECT
    USING (code_sha256 = querylayer.ctx_presented_fingerprint());

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
CREATE POLICY oauth_refresh_lookup ON querylayer.oauth_refresh_tokens FOR SELECT
    USING (token_sha256 = querylayer.ctx_presented_fingerprint());
CREATE INDEX oauth_refresh_tokens_grant ON querylayer.oauth_refresh_tokens (grant_id);

-- Codes, grants and refresh tokens are never deleted and change one way only: a code is used
-- once, a refresh token spent once, a grant moves to its next connection or is revoked once.
CREATE FUNCTION querylayer.oauth_rows_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION '% are never deleted', TG_TABLE_NAME USING ERRCODE = 'QL423';
    END IF;
    IF TG_TABLE_NAME = 'oauth_codes' THEN
        IF OLD.used_at IS NOT NULL THEN
            RAISE EXCEPTION 'this authorization code was already used' USING ERRCODE = 'QL409';
        END IF;
        IF (to_jsonb(NEW) - 'used_at' - 'grant_id') IS DISTINCT FROM (to_jsonb(OLD) - 'used_at' - 'grant_id')
           OR NEW.used_at IS NULL THEN
            RAISE EXCEPTION 'only its one use may change an authorization code' USING ERRCODE = 'QL423';
        END IF;
    ELSIF TG_TABLE_NAME = 'oauth_refresh_tokens' THEN
        IF OLD.spent_at IS NOT NULL THEN
            RAISE EXCEPTION 'this refresh token was already spent' USING ERRCODE = 'QL409';
        END IF;
        IF (to_jsonb(NEW) - 'spent_at') IS DISTINCT FROM (to_jsonb(OLD) - 'spent_at') OR NEW.spent_at IS NULL THEN
            RAISE EXCEPTION 'only spending may change a refresh token' USING ERRCODE = 'QL423';
        END IF;
    ELSE
        IF OLD.revoked_at IS NOT NULL THEN
            RAISE EXCEPTION 'this grant is already revoked' USING ERRCODE = 'QL409';
        END IF;
        IF (to_jsonb(NEW) - 'revoked_at' - 'revoked_reason' - 'connection_id' - 'generation')
               IS DISTINCT FROM (to_jsonb(OLD) - 'revoked_at' - 'revoked_reason' - 'connection_id' - 'generation')
           OR NEW.generation NOT IN (OLD.generation, OLD.generation + 1)
           OR (NEW.revoked_at IS NULL AND NEW.generation = OLD.generation) THEN
            RAISE EXCEPTION 'a grant only moves to its next connection or is revoked' USING ERRCODE = 'QL423';
        END IF;
    END IF;
    RETURN NEW;
END
$$;
SELECT querylayer.guard_rows(format('querylayer.%I', t)::regclass, 'querylayer.oauth_rows_guard'::regproc, false)
  FROM unnest(ARRAY['oauth_codes', 'oauth_grants', 'oauth_refresh_tokens']) t;

-- A redirect URI a client may register: https anywhere (no fragment, no user info), or http on
-- a loopback host for a native client (RFC 8252 §7.3; any port is matched at use).
CREATE FUNCTION querylayer.oauth_redirect_uri_valid(p_uri text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN p_uri IS NOT NULL AND length(p_uri) <= 512 AND p_uri !~ '[[:space:][:cntrl:]#]'
       AND (p_uri ~ '^https://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[^@]*)?$'
            OR p_uri ~ '^http://(127\.0\.0\.1|\[::1\]|localhost)(:[0-9]{1,5})?(/[^@]*)?$');
END
$$;

-- The redirect URI of a request matches a registered one exactly, except that the port of a
-- loopback URI may differ (RFC 8252 §7.3).
CREATE FUNCTION querylayer.oauth_redirect_uri_matches(p_registered text[], p_uri text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN p_uri = ANY (p_registered)
        OR (p_uri ~ '^http://(127\.0\.0\.1|\[::1\]|localhost)(:[0-9]{1,5})?(/|$)'
            AND EXISTS (SELECT 1 FROM unnest(p_registered) r
                         WHERE regexp_replace(r, '^(http://(127\.0\.0\.1|\[::1\]|localhost))(:[0-9]{1,5})?', '\1')
                             = regexp_replace(p_uri, '^(http://(127\.0\.0\.1|\[::1\]|localhost))(:[0-9]{1,5})?', '\1')));
END
$$;

-- The S256 PKCE challenge of a verifier (RFC 7636 §4.2): BASE64URL(SHA-256(verifier)).
CREATE FUNCTION querylayer.pkce_s256(p_verifier text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN rtrim(translate(encode(sha256(convert_to(p_verifier, 'UTF8')), 'base64'), E'+/\n', '-_'), '=');
END
$$;

-- Dynamic client registration (RFC 7591): anyone may register a public client; registering
-- grants nothing until a member consents. From p_peer at most p_rate a second beyond p_burst
-- (sql/157_rate.sql; QL429), so that every edge shares one limit per address.
CREATE FUNCTION querylayer_api.oauth_register_client(p_client_name text, p_redirect_uris text[],
                                                     p_peer text DEFAULT NULL, p_rate double precision DEFAULT NULL,
                                                     p_burst double precision DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_client querylayer.oauth_clients;
    v_bad    text;
BEGIN
    PERFORM querylayer.refuse_rate(querylayer.take_token('oauth_register'::text, left(p_peer, 64), p_rate, p_burst),
                                   'registration'::text);
    IF p_redirect_uris IS NULL OR cardinality(p_redirect_uris) NOT BETWEEN 1 AND 8 THEN
        RAISE EXCEPTION 'redirect_uris: one to eight redirect URIs are required' USING ERRCODE = '22023';
    END IF;
    SELECT u INTO v_bad FROM unnest(p_redirect_uris) u WHERE NOT querylayer.oauth_redirect_uri_valid(u) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'redirect_uris: % is neither https nor a loopback http URI', left(coalesce(v_bad, 'NULL'), 200)
            USING ERRCODE = '22023', HINT = 'native clients use http://127.0.0.1:<port>/… (RFC 8252)';
    END IF;
    INSERT INTO querylayer.oauth_clients (client_id, client_name, redirect_uris)
    VALUES ('qlo_' || replace(gen_random_uuid()::text, '-', ''),
            coalesce(nullif(btrim(regexp_replace(coalesce(p_client_name, ''), '[[:cntrl:]]', '', 'g')), ''), 'unnamed client'),
            p_redirect_uris)
    RETURNING * INTO v_client;
    RETURN jsonb_build_object('client_id', v_client.client_id, 'client_name', v_client.client_name,
                              'redirect_uris', to_jsonb(v_client.redirect_uris),
                              'client_id_issued_at', extract(epoch FROM v_client.created_at)::bigint);
END
$$;

-- What a client may do now: the registered row, or for a metadata-document client its newest
-- document. No row for an unknown client.
CREATE FUNCTION querylayer.oauth_client_now(p_client_id text)
RETURNS TABLE (client_id text, client_name text, redirect_uris text[], from_document boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
        SELECT c.client_id, coalesce(d.client_name, c.client_name), coalesce(d.redirect_uris, c.redirect_uris),
               d.client_id IS NOT NULL
          FROM querylayer.oauth_clients c
          LEFT JOIN LATERAL (SELECT * FROM querylayer.oauth_client_documents x
                              WHERE x.client_id = c.client_id ORDER BY x.fetched_at DESC LIMIT 1) d ON true
         WHERE c.client_id = p_client_id;
END
$$;

-- Records the Client ID Metadata Document the edge fetched from p_client_id (its JSON, as
-- parsed): it must name itself (client_id equal to the URL), list one to eight redirect URIs
-- that are https or loopback http, and be a public client (token_endpoint_auth_method none, when
-- given; grant types within authorization_code and refresh_token). A new version is kept only
-- when the document changed. Anyone may record one: a document grants nothing until a member
-- consents, and its URL is the client's identity. Returns {client_id, client_name,
-- redirect_uris, changed}.
CREATE FUNCTION querylayer_api.oauth_record_client_document(p_client_id text, p_document jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_name   text;
    v_uris   text[];
    v_bad    text;
    v_sha    bytea;
    v_now    record;
    v_change boolean := false;
BEGIN
    IF NOT querylayer.oauth_document_url_valid(p_client_id) THEN
        RAISE EXCEPTION 'client_id: a client metadata document is named by an https URL with a path' USING ERRCODE = '22023';
    END IF;
    IF p_document IS NULL OR jsonb_typeof(p_document) <> 'object' THEN
        RAISE EXCEPTION 'the client metadata document must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF p_document->>'client_id' IS DISTINCT FROM p_client_id THEN
        RAISE EXCEPTION 'the client metadata document names another client_id than its own URL' USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(p_document->'redirect_uris') IS DISTINCT FROM 'array'
       OR jsonb_array_length(p_document->'redirect_uris') NOT BETWEEN 1 AND 8
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_document->'redirect_uris') e WHERE jsonb_typeof(e) <> 'string') THEN
        RAISE EXCEPTION 'redirect_uris: one to eight redirect URIs are required' USING ERRCODE = '22023';
    END IF;
    v_uris := ARRAY(SELECT jsonb_array_elements_text(p_document->'redirect_uris'));
    SELECT u INTO v_bad FROM unnest(v_uris) u WHERE NOT querylayer.oauth_redirect_uri_valid(u) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'redirect_uris: % is neither https nor a loopback http URI', left(coalesce(v_bad, 'NULL'), 200)
            USING ERRCODE = '22023';
    END IF;
    IF coalesce(p_document->>'token_endpoint_auth_method', 'none') <> 'none' THEN
        RAISE EXCEPTION 'token_endpoint_auth_method: only public clients (none) are supported' USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(p_document->'grant_types') = 'array' AND EXISTS (
        SELECT 1 FROM jsonb_array_elements_text(p_document->'grant_types') g WHERE g NOT IN ('authorization_code', 'refresh_token')) THEN
        RAISE EXCEPTION 'grant_types: only authorization_code and refresh_token' USING ERRCODE = '22023';
    END IF;
    v_name := coalesce(nullif(btrim(regexp_replace(left(coalesce(p_document->>'client_name', ''), 120), '[[:cntrl:]]', '', 'g')), ''),
                       substring(p_client_id FROM '^https://([^/:]+)'));
    v_sha := sha256(convert_to(p_document::text, 'UTF8'));
    INSERT INTO querylayer.oauth_clients (client_id, client_name, redirect_uris)
    VALUES (p_client_id, v_name, v_uris) ON CONFLICT (client_id) DO NOTHING;
    SELECT * INTO v_now FROM querylayer.oauth_client_now(p_client_id);
    IF NOT v_now.from_document OR v_now.client_name <> v_name OR v_now.redirect_uris <> v_uris
       OR (SELECT d.document_sha256 FROM querylayer.oauth_client_documents d
            WHERE d.client_id = p_client_id ORDER BY d.fetched_at DESC LIMIT 1) IS DISTINCT FROM v_sha THEN
        INSERT INTO querylayer.oauth_client_documents (client_id, document_sha256, client_name, redirect_uris)
        VALUES (p_client_id, v_sha, v_name, v_uris);
        v_change := true;
    END IF;
    RETURN jsonb_build_object('client_id', p_client_id, 'client_name', v_name, 'redirect_uris', to_jsonb(v_uris),
                              'changed', v_change);
END
$$;

-- A client, for the consent page: its name and whether p_redirect_uri is one of its own.
-- 22023 for an unknown client.
CREATE FUNCTION querylayer_api.oauth_client(p_client_id text, p_redirect_uri text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_client record;
BEGIN
    SELECT * INTO v_client FROM querylayer.oauth_client_now(p_client_id);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'client_id: no such client' USING ERRCODE = '22023';
    END IF;
    RETURN jsonb_build_object('client_id', v_client.client_id, 'client_name', v_client.client_name,
                              'from_document', v_client.from_document,
                              'redirect_uri_ok', querylayer.oauth_redirect_uri_matches(v_client.redirect_uris, p_redirect_uri));
END
$$;

-- A new agent of the context's organization for one client, named after it
-- (oauth-<name>[-n]): what consent registers when the member chooses "a new agent".
CREATE FUNCTION querylayer.oauth_new_agent(p_client_name text) RETURNS querylayer.agents
LANGUAGE plpgsql AS $$
DECLARE
    v_base text := 'oauth-' || coalesce(nullif(left(trim(both '-' FROM regexp_replace(lower(p_client_name), '[^a-z0-9]+', '-', 'g')), 40), ''), 'client');
    v_handle text := v_base;
    v      querylayer.agents;
    i      integer := 1;
BEGIN
    WHILE EXISTS (SELECT 1 FROM querylayer.agents a WHERE a.organization_id = querylayer.ctx_organization_id()
                     AND (a.handle = v_handle OR a.principal = v_handle)) LOOP
        i := i + 1;
        v_handle := v_base || '-' || i;
    END LOOP;
    INSERT INTO querylayer.agents (organization_id, handle, kind, principal)
    VALUES (querylayer.ctx_organization_id(), v_handle, 'generic', v_handle)
    RETURNING * INTO v;
    PERFORM querylayer.audit('agent.create'::text, v.id::text,
        jsonb_build_object('handle', v.handle, 'kind', v.kind, 'for_oauth_client', p_client_name));
    RETURN v;
END
$$;

-- The member's consent ("Allow"): an owner or admin of the context's site lets p_agent act for
-- the client with p_scopes (never more than the agent holds on the site) until p_expires_at.
-- With p_new_agent, p_agent is ignored: a new agent is registered for the client and granted
-- p_scopes on the site (the member may grant scopes, console_grant_agent_scopes). Returns the
-- authorization code, once; only its SHA-256 is kept.
CREATE FUNCTION querylayer_api.oauth_consent(
    p_client_id text, p_redirect_uri text, p_code_challenge text, p_code_challenge_method text,
    p_resource text, p_agent text, p_scopes text[], p_expires_at timestamptz, p_new_agent boolean DEFAULT false
) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_client  record;
    v_agent   querylayer.agents;
    v_scopes  text[];
    v_missing text[];
    v_new     record;
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']);
    SELECT * INTO v_client FROM querylayer.oauth_client_now(p_client_id);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'client_id: no such client' USING ERRCODE = '22023';
    END IF;
    IF NOT querylayer.oauth_redirect_uri_matches(v_client.redirect_uris, p_redirect_uri) THEN
        RAISE EXCEPTION 'redirect_uri: not one the client registered' USING ERRCODE = '22023';
    END IF;
    IF p_code_challenge_method IS DISTINCT FROM 'S256' OR p_code_challenge IS NULL
       OR p_code_challenge !~ '^[A-Za-z0-9_-]{43}$' THEN
        RAISE EXCEPTION 'code_challenge: a PKCE S256 challenge is required' USING ERRCODE = '22023';
    END IF;
    IF p_resource IS NULL OR p_resource = '' THEN
        RAISE EXCEPTION 'resource: the resource indicator is required' USING ERRCODE = '22023';
    END IF;
    v_scopes := querylayer.normalize_scopes(p_scopes);
    IF coalesce(p_new_agent, false) THEN
        v_agent := querylayer.oauth_new_agent(v_client.client_name);
        PERFORM querylayer.change_agent_scopes(querylayer.ctx_site_id(), v_agent, v_scopes, true,
                                               'member:' || querylayer.ctx_member_id());
    ELSE
        v_agent := querylayer.agent_by_handle(querylayer.ctx_organization_id(), p_agent);
    END IF;
    SELECT array_agg(s ORDER BY s) INTO v_missing
      FROM unnest(v_scopes) AS s
     WHERE NOT EXISTS (SELECT 1 FROM querylayer.agent_site_permissions p
                        WHERE p.site_id = querylayer.ctx_site_id() AND p.agent_id = v_agent.id AND p.scope = s);
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'the agent does not hold % on this site: %',
            CASE WHEN cardinality(v_missing) = 1 THEN 'this scope' ELSE 'these scopes' END,
            array_to_string(v_missing, ', ')
            USING ERRCODE = 'QL403', HINT = 'consent cannot give more than the agent holds; grant the permission first';
    END IF;
    SELECT * INTO v_new FROM querylayer.new_secret('qla'::text);
    INSERT INTO querylayer.oauth_codes (code_sha256, site_id, organization_id, client_id, redirect_uri, code_challenge,
                                        resource, member_id, agent_id, scopes, grant_expires_at, expires_at)
    VALUES (v_new.fingerprint, querylayer.ctx_site_id(), querylayer.ctx_organization_id(), v_client.client_id,
            p_redirect_uri, p_code_challenge, p_resource, querylayer.ctx_member_id(), v_agent.id, v_scopes,
            querylayer.check_expiry(p_expires_at),
            now() + make_interval(secs => coalesce(querylayer.setting_int('oauth_code_ttl_seconds'::text), 60)));
    PERFORM querylayer.audit('oauth.consent'::text, v_client.client_id,
        jsonb_build_object('client_name', v_client.client_name, 'agent_id', v_agent.id, 'scopes', v_scopes,
                           'new_agent', coalesce(p_new_agent, false), 'expires_at', p_expires_at));
    RETURN jsonb_build_object('code', v_new.secret, 'agent', v_agent.handle, 'scopes', to_jsonb(v_scopes),
                              'new_agent', coalesce(p_new_agent, false));
END
$$;

-- The token endpoint's answer (RFC 6749 §5.1), with the grant and connection for the audit.
CREATE FUNCTION querylayer.oauth_token_answer(p_grant querylayer.oauth_grants, p_conn jsonb, p_refresh text,
                                              p_expires timestamptz) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN jsonb_build_object(
        'ok', true, 'grant_id', p_grant.id, 'connection_id', p_conn->'connection_id',
        'access_token', p_conn->'secret', 'token_type', 'Bearer',
        'expires_in', greatest(1, floor(extract(epoch FROM p_expires - now())))::bigint,
        'refresh_token', p_refresh, 'scope', array_to_string(p_grant.scopes, ' '));
END
$$;

-- A grant's next access token: its connection is revoked and a new one issued (an hour at most,
-- never past the grant), with the next refresh token.
CREATE FUNCTION querylayer.oauth_rotate(p_grant querylayer.oauth_grants) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_conn    jsonb;
    v_refresh record;
    v_expires timestamptz := least(now() + interval '1 hour', p_grant.expires_at);
BEGIN
    PERFORM querylayer.revoke_credential('querylayer.connections'::regclass, p_grant.connection_id,
                                         'oauth: refreshed'::text);
    v_conn := querylayer.issue_connection(p_grant.site_id, p_grant.agent_id, 'oauth ' || p_grant.id::text,
                                          p_grant.scopes, v_expires, 'oauth'::text,
                                          'member:' || p_grant.member_id::text);
    UPDATE querylayer.oauth_grants SET connection_id = (v_conn->>'connection_id')::uuid, generation = generation + 1
     WHERE id = p_grant.id;
    SELECT * INTO v_refresh FROM querylayer.new_secret('qlr'::text);
    INSERT INTO querylayer.oauth_refresh_tokens (token_sha256, grant_id, site_id, organization_id)
    VALUES (v_refresh.fingerprint, p_grant.id, p_grant.site_id, p_grant.organization_id);
    RETURN querylayer.oauth_token_answer(p_grant, v_conn, v_refresh.secret, v_expires);
END
$$;

-- Ends a grant and its connection (its next request is refused).
CREATE FUNCTION querylayer.oauth_revoke_grant(p_grant_id uuid, p_reason text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_grant querylayer.oauth_grants;
BEGIN
    SELECT * INTO v_grant FROM querylayer.oauth_grants WHERE id = p_grant_id;
    IF NOT FOUND OR v_grant.revoked_at IS NOT NULL THEN
        RETURN;
    END IF;
    UPDATE querylayer.oauth_grants SET revoked_at = now(), revoked_reason = p_reason WHERE id = p_grant_id;
    PERFORM querylayer.revoke_credential('querylayer.connections'::regclass, v_grant.connection_id, p_reason);
    PERFORM querylayer.audit('oauth.revoke'::text, p_grant_id::text,
        jsonb_build_object('client_id', v_grant.client_id, 'connection_id', v_grant.connection_id, 'reason', p_reason));
END
$$;

-- The token endpoint's refusal: RFC 6749 §5.2 `invalid_grant`, committed (not raised), so that
-- what it revoked and recorded stays.
CREATE FUNCTION querylayer.oauth_refused(p_reason text, p_detail jsonb DEFAULT '{}') RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM querylayer.audit('oauth.token'::text, NULL::text, coalesce(p_detail, '{}') || jsonb_build_object('reason', p_reason),
                             'denied'::text);
    RETURN jsonb_build_object('ok', false, 'error', 'invalid_grant', 'reason', p_reason);
END
$$;

-- Redeems an authorization code (called by the extension in the code's site, resolving). A code
-- is good once, within its minute, for the client it was issued to, at the same redirect URI,
-- with the verifier of its challenge and for the same resource. A code presented again revokes
-- the grant it made (RFC 6749 §4.1.2).
CREATE FUNCTION querylayer.oauth_redeem_code(
    p_code_sha256 bytea, p_client_id text, p_redirect_uri text, p_code_verifier text, p_resource text
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_code   querylayer.oauth_codes;
    v_grant  querylayer.oauth_grants;
    v_tokens jsonb;
BEGIN
    SELECT * INTO v_code FROM querylayer.oauth_codes WHERE code_sha256 = p_code_sha256 FOR UPDATE;
    IF NOT FOUND THEN
        RETURN querylayer.oauth_refused('unknown code'::text);
    END IF;
    IF v_code.used_at IS NOT NULL THEN
        IF v_code.grant_id IS NOT NULL THEN
            PERFORM querylayer.oauth_revoke_grant(v_code.grant_id, 'oauth: authorization code reused'::text);
        END IF;
        RETURN querylayer.oauth_refused('code reused'::text, jsonb_build_object('client_id', v_code.client_id, 'grant_id', v_code.grant_id));
    END IF;
    IF v_code.expires_at <= clock_timestamp() THEN
        RETURN querylayer.oauth_refused('code expired'::text, jsonb_build_object('client_id', v_code.client_id));
    END IF;
    IF p_client_id IS DISTINCT FROM v_code.client_id THEN
        RETURN querylayer.oauth_refused('another client'::text, jsonb_build_object('client_id', v_code.client_id));
    END IF;
    IF p_redirect_uri IS DISTINCT FROM v_code.redirect_uri THEN
        RETURN querylayer.oauth_refused('redirect_uri differs'::text, jsonb_build_object('client_id', v_code.client_id));
    END IF;
    IF p_code_verifier IS NULL OR p_code_verifier !~ '^[A-Za-z0-9._~-]{43,128}$'
       OR querylayer.pkce_s256(p_code_verifier) <> v_code.code_challenge THEN
        RETURN querylayer.oauth_refused('wrong code_verifier'::text, jsonb_build_object('client_id', v_code.client_id));
    END IF;
    IF p_resource IS DISTINCT FROM v_code.resource THEN
        RETURN querylayer.oauth_refused('resource differs'::text, jsonb_build_object('client_id', v_code.client_id));
    END IF;
    -- The code is spent before anything is issued: a concurrent redemption waits on the row lock
    -- above and then finds it used.
    v_grant.id := gen_random_uuid();
    UPDATE querylayer.oauth_codes SET used_at = now(), grant_id = v_grant.id WHERE code_sha256 = p_code_sha256;
    v_grant.site_id := v_code.site_id;
    v_grant.organization_id := v_code.organization_id;
    v_grant.agent_id := v_code.agent_id;
    v_grant.member_id := v_code.member_id;
    v_grant.scopes := v_code.scopes;
    v_grant.expires_at := v_code.grant_expires_at;
    BEGIN
        v_tokens := querylayer.oauth_issue_first(v_grant, v_code);
    EXCEPTION WHEN SQLSTATE 'QL403' THEN
        -- The agent lost a consented scope since (the connection trigger refused): no grant.
        RETURN querylayer.oauth_refused('the agent no longer holds the scopes'::text,
                                        jsonb_build_object('client_id', v_code.client_id, 'error', SQLERRM));
    END;
    PERFORM querylayer.audit('oauth.grant'::text, v_grant.id::text,
        jsonb_build_object('client_id', v_code.client_id, 'member_id', v_code.member_id, 'agent_id', v_code.agent_id,
                           'scopes', v_code.scopes, 'connection_id', v_tokens->'connection_id',
                           'expires_at', v_code.grant_expires_at));
    RETURN v_tokens;
END
$$;

-- The grant's first connection, then the grant row naming it, then its first refresh token.
CREATE FUNCTION querylayer.oauth_issue_first(p_grant querylayer.oauth_grants, p_code querylayer.oauth_codes)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_conn    jsonb;
    v_refresh record;
    v_expires timestamptz := least(now() + interval '1 hour', p_grant.expires_at);
BEGIN
    v_conn := querylayer.issue_connection(p_grant.site_id, p_grant.agent_id, 'oauth ' || p_grant.id::text,
                                          p_grant.scopes, v_expires, 'oauth'::text,
                                          'member:' || p_grant.member_id::text);
    INSERT INTO querylayer.oauth_grants (id, site_id, organization_id, client_id, member_id, agent_id, scopes, resource,
                                         connection_id, expires_at)
    VALUES (p_grant.id, p_grant.site_id, p_grant.organization_id, p_code.client_id, p_grant.member_id, p_grant.agent_id,
            p_grant.scopes, p_code.resource, (v_conn->>'connection_id')::uuid, p_grant.expires_at)
    RETURNING * INTO p_grant;
    SELECT * INTO v_refresh FROM querylayer.new_secret('qlr'::text);
    INSERT INTO querylayer.oauth_refresh_tokens (token_sha256, grant_id, site_id, organization_id)
    VALUES (v_refresh.fingerprint, p_grant.id, p_grant.site_id, p_grant.organization_id);
    RETURN querylayer.oauth_token_answer(p_grant, v_conn, v_refresh.secret, v_expires);
END
$$;

-- Spends a refresh token (called by the extension in the token's site, resolving): the grant's
-- connection is replaced by a new one and a new refresh token issued. A spent token presented
-- again revokes the grant and its connection.
CREATE FUNCTION querylayer.oauth_use_refresh(p_token_sha256 bytea, p_client_id text, p_resource text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_token  querylayer.oauth_refresh_tokens;
    v_grant  querylayer.oauth_grants;
    v_tokens jsonb;
BEGIN
    SELECT * INTO v_token FROM querylayer.oauth_refresh_tokens WHERE token_sha256 = p_token_sha256 FOR UPDATE;
    IF NOT FOUND THEN
        RETURN querylayer.oauth_refused('unknown refresh token'::text);
    END IF;
    SELECT * INTO v_grant FROM querylayer.oauth_grants WHERE id = v_token.grant_id FOR UPDATE;
    IF v_token.spent_at IS NOT NULL THEN
        PERFORM querylayer.audit('oauth.refresh_reuse'::text, v_grant.id::text,
            jsonb_build_object('client_id', v_grant.client_id, 'connection_id', v_grant.connection_id), 'denied'::text);
        PERFORM querylayer.oauth_revoke_grant(v_grant.id, 'oauth: refresh token reused'::text);
        RETURN jsonb_build_object('ok', false, 'error', 'invalid_grant', 'reason', 'refresh token reused');
    END IF;
    IF v_grant.revoked_at IS NOT NULL THEN
        RETURN querylayer.oauth_refused('grant revoked'::text, jsonb_build_object('grant_id', v_grant.id));
    END IF;
    IF EXISTS (SELECT 1 FROM querylayer.connections c WHERE c.id = v_grant.connection_id AND c.revoked_at IS NOT NULL) THEN
        -- Its connection was revoked (the dashboard, an operator): the grant ends with it.
        PERFORM querylayer.oauth_revoke_grant(v_grant.id, 'oauth: connection revoked'::text);
        RETURN querylayer.oauth_refused('connection revoked'::text, jsonb_build_object('grant_id', v_grant.id));
    END IF;
    IF v_grant.expires_at <= clock_timestamp() THEN
        RETURN querylayer.oauth_refused('grant expired'::text, jsonb_build_object('grant_id', v_grant.id));
    END IF;
    IF p_client_id IS DISTINCT FROM v_grant.client_id THEN
        RETURN querylayer.oauth_refused('another client'::text, jsonb_build_object('grant_id', v_grant.id));
    END IF;
    IF p_resource IS NOT NULL AND p_resource IS DISTINCT FROM v_grant.resource THEN
        RETURN querylayer.oauth_refused('resource differs'::text, jsonb_build_object('grant_id', v_grant.id));
    END IF;
    UPDATE querylayer.oauth_refresh_tokens SET spent_at = now() WHERE token_sha256 = p_token_sha256;
    BEGIN
        v_tokens := querylayer.oauth_rotate(v_grant);
    EXCEPTION WHEN SQLSTATE 'QL403' THEN
        -- The agent lost a scope of the grant since the consent: the grant ends.
        PERFORM querylayer.oauth_revoke_grant(v_grant.id, 'oauth: the agent no longer holds the scopes'::text);
        RETURN querylayer.oauth_refused('the agent no longer holds the scopes'::text,
                                        jsonb_build_object('grant_id', v_grant.id, 'error', SQLERRM));
    END;
    PERFORM querylayer.audit('oauth.refresh'::text, v_grant.id::text,
        jsonb_build_object('client_id', v_grant.client_id, 'connection_id', v_tokens->'connection_id',
                           'previous_connection_id', v_grant.connection_id));
    RETURN v_tokens;
END
$$;

-- Revocation (RFC 7009) by refresh token (called by the extension, resolving): the grant ends.
CREATE FUNCTION querylayer.oauth_revoke_by_refresh(p_token_sha256 bytea, p_client_id text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_grant_id uuid;
    v_client   text;
BEGIN
    SELECT t.grant_id, g.client_id INTO v_grant_id, v_client
      FROM querylayer.oauth_refresh_tokens t JOIN querylayer.oauth_grants g ON g.id = t.grant_id
     WHERE t.token_sha256 = p_token_sha256;
    IF v_grant_id IS NOT NULL AND (p_client_id IS NULL OR p_client_id = v_client) THEN
        PERFORM querylayer.oauth_revoke_grant(v_grant_id, 'oauth: revoked by the client'::text);
    END IF;
    RETURN jsonb_build_object('ok', true);
END
$$;

-- Revocation (RFC 7009) by access token: the caller authenticated the connection in this
-- transaction (querylayer_api.authenticate); its grant ends, or the connection alone when it
-- has none.
CREATE FUNCTION querylayer_api.oauth_revoke_current() RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_grant_id uuid;
BEGIN
    PERFORM querylayer.require_connection(NULL::text);
    SELECT id INTO v_grant_id FROM querylayer.oauth_grants
     WHERE connection_id = querylayer.ctx_connection_id() AND revoked_at IS NULL;
    IF v_grant_id IS NOT NULL THEN
        PERFORM querylayer.oauth_revoke_grant(v_grant_id, 'oauth: revoked by the client'::text);
    ELSE
        PERFORM querylayer.revoke_credential('querylayer.connections'::regclass, querylayer.ctx_connection_id(),
                                             'oauth: revoked by the client'::text);
    END IF;
    RETURN jsonb_build_object('ok', true);
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.oauth_register_client, querylayer_api.oauth_client,
    querylayer_api.oauth_record_client_document, querylayer_api.oauth_consent, querylayer_api.oauth_revoke_current
    TO querylayer_edge;
