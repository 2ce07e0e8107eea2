-- Credentials: agent connections and member tokens. A secret is generated inside the database
-- (querylayer.new_secret, from the operating system's CSPRNG), returned once by the creating
-- function and stored only as a display prefix plus its SHA-256 fingerprint.

-- The fingerprint index. It is the one table read before a request context exists, and its
-- row-level security shows a row only while the extension is resolving that very fingerprint.
CREATE TABLE querylayer.credentials (
    fingerprint     bytea PRIMARY KEY CHECK (length(fingerprint) = 32),
    kind            text NOT NULL CHECK (kind IN ('connection', 'member_token', 'member_session', 'invitation',
                                                 'delivery_token')),
    subject_id      uuid NOT NULL UNIQUE,
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT
);
ALTER TABLE querylayer.credentials ENABLE ROW LEVEL SECURITY;
ALTER TABLE querylayer.credentials FORCE ROW LEVEL SECURITY;
CREATE POLICY credential_lookup ON querylayer.credentials FOR SELECT
    USING (fingerprint = querylayer.ctx_presented_fingerprint());
CREATE POLICY credential_issue ON querylayer.credentials FOR INSERT
    WITH CHECK (site_id = querylayer.ctx_site_id());
SELECT querylayer.make_append_only('querylayer.credentials'::regclass);

CREATE TABLE querylayer.connections (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    agent_id        uuid NOT NULL REFERENCES querylayer.agents ON DELETE RESTRICT,
    name            text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9 ._:@-]{0,79}$'),
    prefix          text NOT NULL,
    scopes          text[] NOT NULL CHECK (cardinality(scopes) > 0),
    harness         text NOT NULL DEFAULT 'generic' CHECK (harness ~ '^[a-z0-9][a-z0-9._-]{0,39}$'),
    did             text,
    expires_at      timestamptz NOT NULL,
    revoked_at      timestamptz,
    revoked_reason  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      text NOT NULL,
    CHECK (expires_at > created_at)
);
SELECT querylayer.isolate_by_site('querylayer.connections'::regclass);
SELECT querylayer.decides_liveness('querylayer.connections'::regclass);
CREATE UNIQUE INDEX connections_live_name ON querylayer.connections (site_id, name) WHERE revoked_at IS NULL;
CREATE INDEX connections_agent ON querylayer.connections (site_id, agent_id);

-- A connection never expands its agent's authority: every scope must be a current permission
-- of the agent on the site. Checked here for every insert, whoever makes it.
CREATE FUNCTION querylayer.connections_check_scopes() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_missing text[];
BEGIN
    IF querylayer.restoring() THEN
        RETURN NEW;  -- a restore brings the row as it was dumped
    END IF;
    NEW.scopes := querylayer.normalize_scopes(NEW.scopes);
    SELECT array_agg(s ORDER BY s) INTO v_missing
      FROM unnest(NEW.scopes) AS s
     WHERE NOT EXISTS (SELECT 1 FROM querylayer.agent_site_permissions p
                        WHERE p.site_id = NEW.site_id AND p.agent_id = NEW.agent_id AND p.scope = s);
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'the agent does not hold % on this site: %',
            CASE WHEN cardinality(v_missing) = 1 THEN 'this scope' ELSE 'these scopes' END,
            array_to_string(v_missing, ', ')
            USING ERRCODE = 'QL403',
                  HINT = 'a connection cannot expand its agent''s authority; grant the permission first';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER connections_check_scopes BEFORE INSERT ON querylayer.connections
    FOR EACH ROW EXECUTE FUNCTION querylayer.connections_check_scopes();
ALTER TABLE querylayer.connections ENABLE ALWAYS TRIGGER connections_check_scopes;

-- Credentials are immutable except for their one-way revocation.
CREATE FUNCTION querylayer.credential_rows_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION '% are never deleted; revoke instead', TG_TABLE_NAME USING ERRCODE = 'QL423';
    END IF;
    IF OLD.revoked_at IS NOT NULL THEN
        RAISE EXCEPTION 'this credential is already revoked' USING ERRCODE = 'QL409';
    END IF;
    IF (to_jsonb(NEW) - 'revoked_at' - 'revoked_reason') IS DISTINCT FROM (to_jsonb(OLD) - 'revoked_at' - 'revoked_reason')
       OR NEW.revoked_at IS NULL THEN
        RAISE EXCEPTION 'only revocation may change a credential' USING ERRCODE = 'QL423';
    END IF;
    RETURN NEW;
END
$$;
SELECT querylayer.guard_rows('querylayer.connections'::regclass, 'querylayer.credential_rows_guard'::regproc, false);

CREATE TABLE querylayer.member_tokens (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    member_id       uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    name            text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9 ._:@-]{0,79}$'),
    prefix          text NOT NULL,
    expires_at      timestamptz NOT NULL,
    revoked_at      timestamptz,
    revoked_reason  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      text NOT NULL,
    CHECK (expires_at > created_at)
);
SELECT querylayer.isolate_by_site('querylayer.member_tokens'::regclass);
SELECT querylayer.guard_rows('querylayer.member_tokens'::regclass, 'querylayer.credential_rows_guard'::regproc, false);

-- The longest a credential may live. Short-lived credentials are the default everywhere.
CREATE FUNCTION querylayer.check_expiry(p_expires_at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_expires_at IS NULL THEN
        RAISE EXCEPTION 'an expiry is required' USING ERRCODE = '22023';
    END IF;
    IF p_expires_at <= now() THEN
        RAISE EXCEPTION 'the expiry % is not in the future', p_expires_at USING ERRCODE = '22023';
    END IF;
    IF p_expires_at > now() + interval '366 days' THEN
        RAISE EXCEPTION 'the expiry % is more than a year away', p_expires_at USING ERRCODE = '22023',
            HINT = 'issue a new credential before this one expires instead';
    END IF;
    RETURN p_expires_at;
END
$$;

-- Issues a connection and returns its secret. The only place a connection secret exists.
-- With p_did the connection is also bound to that did:key (signed envelopes act as it); with
-- p_secret false it has no secret at all and only envelopes from that key act as it.
-- Binding a did:key takes its holder's proof of possession (p_did_proof, checked by
-- querylayer.check_did_proof): a did:key is public, and without it anyone could bind another's key.
CREATE FUNCTION querylayer.issue_connection(
    p_site_id uuid, p_agent_id uuid, p_name text, p_scopes text[], p_expires_at timestamptz,
    p_harness text, p_created_by text, p_did text DEFAULT NULL, p_secret boolean DEFAULT true,
    p_did_proof jsonb DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_site querylayer.sites;
    v_conn querylayer.connections;
    v_new  record;
BEGIN
    SELECT * INTO v_site FROM querylayer.sites WHERE id = p_site_id;
    IF p_did IS NOT NULL AND NOT querylayer.did_key_valid(p_did) THEN
        RAISE EXCEPTION 'did: % is not an Ed25519 did:key (did:key:z6Mk…)', quote_literal(p_did) USING ERRCODE = '22023';
    END IF;
    IF p_did IS NULL AND NOT coalesce(p_secret, true) THEN
        RAISE EXCEPTION 'a connection needs a secret, a did:key, or both' USING ERRCODE = '22023';
    END IF;
    IF p_did IS NOT NULL AND querylayer.did_key_in_use(p_did) THEN
        RAISE EXCEPTION 'did:key % is bound to a live connection', p_did USING ERRCODE = 'QL409',
            HINT = 'revoke that connection first, or bind another key';
    END IF;
    IF p_did IS NOT NULL THEN
        PERFORM querylayer.check_did_proof(p_site_id, p_did, p_did_proof);
    END IF;
    IF EXISTS (SELECT 1 FROM querylayer.connections
                WHERE site_id = p_site_id AND name = p_name AND revoked_at IS NULL) THEN
        RAISE EXCEPTION 'a live connection named % already exists on this site', quote_literal(p_name)
            USING ERRCODE = 'QL409', HINT = 'revoke it first or choose another name';
    END IF;
    IF coalesce(p_secret, true) THEN
        SELECT * INTO v_new FROM querylayer.new_secret('qlc'::text);
    ELSE
        SELECT NULL::text AS secret, NULL::bytea AS fingerprint, '(did:key only)'::text AS prefix INTO v_new;
    END IF;
    INSERT INTO querylayer.connections (site_id, organization_id, agent_id, name, prefix, scopes,
                                        harness, did, expires_at, created_by)
    VALUES (p_site_id, v_site.organization_id, p_agent_id, p_name, v_new.prefix, p_scopes,
            coalesce(p_harness, 'generic'), p_did, querylayer.check_expiry(p_expires_at), p_created_by)
    RETURNING * INTO v_conn;
    IF v_new.fingerprint IS NOT NULL THEN
        INSERT INTO querylayer.credentials (fingerprint, kind, subject_id, site_id, organization_id)
        VALUES (v_new.fingerprint, 'connection', v_conn.id, v_conn.site_id, v_conn.organization_id);
    END IF;
    IF p_did IS NOT NULL THEN
        INSERT INTO querylayer.did_bindings (connection_id, did, did_sha256, site_id, organization_id)
        VALUES (v_conn.id, p_did, querylayer.did_key_sha256(p_did), v_conn.site_id, v_conn.organization_id);
    END IF;
    PERFORM querylayer.audit('connection.create'::text, v_conn.id::text,
        jsonb_build_object('name', v_conn.name, 'agent_id', v_conn.agent_id, 'scopes', v_conn.scopes,
                           'expires_at', v_conn.expires_at, 'harness', v_conn.harness, 'did', v_conn.did));
    RETURN jsonb_build_object(
        'connection_id', v_conn.id,
        'secret', v_new.secret,
        'did', v_conn.did,
        'prefix', v_conn.prefix,
        'name', v_conn.name,
        'site', v_site.slug,
        'agent_id', v_conn.agent_id,
        'scopes', to_jsonb(v_conn.scopes),
        'harness', v_conn.harness,
        'expires_at', v_conn.expires_at);
END
$$;

CREATE FUNCTION querylayer.issue_member_token(
    p_site_id uuid, p_member_id uuid, p_name text, p_expires_at timestamptz, p_created_by text
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_site  querylayer.sites;
    v_token querylayer.member_tokens;
    v_new   record;
BEGIN
    SELECT * INTO v_site FROM querylayer.sites WHERE id = p_site_id;
    IF NOT EXISTS (SELECT 1 FROM querylayer.site_members WHERE site_id = p_site_id AND member_id = p_member_id) THEN
        RAISE EXCEPTION 'the member has no role on this site' USING ERRCODE = 'QL403';
    END IF;
    SELECT * INTO v_new FROM querylayer.new_secret('qlm'::text);
    INSERT INTO querylayer.member_tokens (site_id, organization_id, member_id, name, prefix, expires_at, created_by)
    VALUES (p_site_id, v_site.organization_id, p_member_id, p_name, v_new.prefix,
            querylayer.check_expiry(p_expires_at), p_created_by)
    RETURNING * INTO v_token;
    INSERT INTO querylayer.credentials (fingerprint, kind, subject_id, site_id, organization_id)
    VALUES (v_new.fingerprint, 'member_token', v_token.id, v_token.site_id, v_token.organization_id);
    PERFORM querylayer.audit('member_token.create'::text, v_token.id::text,
        jsonb_build_object('name', v_token.name, 'member_id', v_token.member_id, 'expires_at', v_token.expires_at));
    RETURN jsonb_build_object(
        'member_token_id', v_token.id,
        'token', v_new.secret,
        'prefix', v_token.prefix,
        'name', v_token.name,
        'site', v_site.slug,
        'member_id', v_token.member_id,
        'expires_at', v_token.expires_at);
END
$$;

-- Called by the extension while it resolves a credential (context kind 'resolving', that
-- credential's site only). Returns the context to hold, or why the credential is dead. Decided on
-- the wall clock (clock_timestamp, not the transaction's start), under the snapshot the
-- extension chooses (the newest: see extension/src/context.rs).
--
-- Unknown, revoked and expired credentials take the same work: one indexed read of the one
-- row (the extension passes the nil id for an unknown fingerprint), then the verdict. Only a
-- live credential is read further. (A connection's verdict, asked at every tool call, is one
-- statement in the extension itself: RESOLVE_CONNECTION in extension/src/context.rs.)
CREATE FUNCTION querylayer.resolve_member_token(p_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r         record;
    v_revoked timestamptz;
    v_expires timestamptz;
BEGIN
    SELECT t.revoked_at, t.expires_at INTO v_revoked, v_expires FROM querylayer.member_tokens t WHERE t.id = p_id;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'unknown');
    ELSIF v_revoked IS NOT NULL THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'revoked');
    ELSIF v_expires <= clock_timestamp() THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'expired');
    END IF;
    SELECT t.*, s.slug AS site_slug, o.slug AS organization_slug, m.handle AS member_handle,
           sm.role
      INTO r
      FROM querylayer.member_tokens t
      JOIN querylayer.sites s ON s.id = t.site_id
      JOIN querylayer.organizations o ON o.id = t.organization_id
      JOIN querylayer.members m ON m.id = t.member_id
      LEFT JOIN querylayer.site_members sm ON sm.site_id = t.site_id AND sm.member_id = t.member_id
     WHERE t.id = p_id;
    IF r.role IS NULL THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'no_site_role');
    END IF;
    RETURN jsonb_build_object(
        'ok', true,
        'organization_id', r.organization_id, 'organization', r.organization_slug,
        'site_id', r.site_id, 'site', r.site_slug,
        'member_id', r.member_id, 'member', r.member_handle, 'role', r.role,
        'member_token_id', r.id,
        'expires_at', r.expires_at);
END
$$;

-- -------------------------------------------------------------------------------------------
-- Managing connections and member tokens: operators (querylayer admin) on any site, members
-- (owner, admin) on their own site through /api/console. Revocation is shared with dashboard
-- sessions (175_dashboard.sql) and delivery tokens (180_delivery.sql).

CREATE FUNCTION querylayer.site_of_credential(p_table regclass, p_id uuid) RETURNS uuid
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_site uuid;
BEGIN
    -- Operators look credentials up across sites; the site list is small.
    FOR v_site IN SELECT id FROM querylayer.sites LOOP
        PERFORM querylayer.enter_operator(v_site);
        EXECUTE format('SELECT site_id FROM %s WHERE id = $1', p_table) INTO v_site USING p_id;
        IF v_site IS NOT NULL THEN
            RETURN v_site;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'no credential %', p_id USING ERRCODE = 'QL404';
END
$$;

CREATE FUNCTION querylayer.revoke_credential(p_table regclass, p_id uuid, p_reason text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_row jsonb;
BEGIN
    EXECUTE format('UPDATE %s SET revoked_at = now(), revoked_reason = $2
                     WHERE id = $1 AND revoked_at IS NULL RETURNING to_jsonb(%s.*)', p_table, p_table)
       INTO v_row USING p_id, p_reason;
    IF v_row IS NULL THEN
        EXECUTE format('SELECT to_jsonb(t.*) FROM %s t WHERE id = $1', p_table) INTO v_row USING p_id;
        IF v_row IS NULL THEN
            RAISE EXCEPTION 'no credential % on this site', p_id USING ERRCODE = 'QL404';
        END IF;
        -- Already revoked: revocation is idempotent, the first time stays recorded.
        RETURN jsonb_build_object('id', p_id, 'revoked_at', v_row->'revoked_at', 'already_revoked', true);
    END IF;
    PERFORM querylayer.audit(CASE p_table::text WHEN 'querylayer.connections' THEN 'connection.revoke'
                                                WHEN 'querylayer.member_sessions' THEN 'session.revoke'
                                                WHEN 'querylayer.delivery_tokens' THEN 'delivery_token.revoke'
                                                ELSE 'member_token.revoke' END,
                             p_id::text, jsonb_build_object('reason', p_reason));
    -- No backend goes on acting with it: those holding its context end now, and one that is
    -- authenticating waits for this revocation to commit, then sees it.
    PERFORM querylayer.end_credential_sessions(p_id);
    RETURN jsonb_build_object('id', p_id, 'revoked_at', v_row->'revoked_at', 'already_revoked', false);
END
$$;

-- Creates a named connection for one agent on one site. The secret is in the result and
-- nowhere else; store it now.
CREATE FUNCTION querylayer_api.create_connection(
    p_site text, p_agent text, p_name text, p_scopes text[], p_expires_at timestamptz,
    p_harness text DEFAULT 'generic', p_did text DEFAULT NULL, p_secret boolean DEFAULT true,
    p_did_proof jsonb DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site  querylayer.sites;
    v_agent querylayer.agents;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    v_agent := querylayer.agent_by_handle(v_site.organization_id, p_agent);
    RETURN querylayer.issue_connection(v_site.id, v_agent.id, p_name, p_scopes, p_expires_at, p_harness,
                                       'operator:' || querylayer.outer_user(), p_did, p_secret, p_did_proof);
END
$$;

CREATE FUNCTION querylayer_api.revoke_connection(p_connection_id uuid, p_reason text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    PERFORM querylayer.enter_operator(querylayer.site_of_credential('querylayer.connections'::regclass, p_connection_id));
    RETURN querylayer.revoke_credential('querylayer.connections'::regclass, p_connection_id, p_reason);
END
$$;

-- Lists a site's connections: never a secret, never a fingerprint.
CREATE FUNCTION querylayer_api.list_connections(p_site text)
RETURNS TABLE (connection_id uuid, name text, agent text, prefix text, did text, scopes text[], effective_scopes text[],
               harness text, expires_at timestamptz, state text, created_at timestamptz, revoked_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    RETURN QUERY
    SELECT c.id, c.name, a.handle, c.prefix, c.did, c.scopes,
           ARRAY(SELECT s FROM unnest(c.scopes) s
                  WHERE EXISTS (SELECT 1 FROM querylayer.agent_site_permissions p
                                 WHERE p.site_id = c.site_id AND p.agent_id = c.agent_id AND p.scope = s) ORDER BY s),
           c.harness, c.expires_at,
           CASE WHEN c.revoked_at IS NOT NULL THEN 'revoked' WHEN c.expires_at <= now() THEN 'expired' ELSE 'active' END,
           c.created_at, c.revoked_at
      FROM querylayer.connections c JOIN querylayer.agents a ON a.id = c.agent_id
     WHERE c.site_id = v_site.id
     ORDER BY c.created_at, c.id;
END
$$;

CREATE FUNCTION querylayer_api.create_member_token(p_site text, p_member text, p_name text, p_expires_at timestamptz) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site   querylayer.sites;
    v_member querylayer.members;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    v_member := querylayer.member_by_handle(v_site.organization_id, p_member);
    RETURN querylayer.issue_member_token(v_site.id, v_member.id, p_name, p_expires_at, 'operator:' || querylayer.outer_user());
END
$$;

CREATE FUNCTION querylayer_api.revoke_member_token(p_token_id uuid, p_reason text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    PERFORM querylayer.enter_operator(querylayer.site_of_credential('querylayer.member_tokens'::regclass, p_token_id));
    RETURN querylayer.revoke_credential('querylayer.member_tokens'::regclass, p_token_id, p_reason);
END
$$;

-- Newest first; a page of p_limit and the cursor of the next.
CREATE FUNCTION querylayer_api.console_list_connections(p_limit integer DEFAULT 100, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']);
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('connections'::text, p_cursor);
    RETURN querylayer.page('connections'::text, 'connections'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', querylayer.page_key(c.created_at), 'id', c.id, 'item', jsonb_build_object(
                'connection_id', c.id, 'name', c.name, 'agent', a.handle, 'prefix', c.prefix, 'did', c.did,
                'scopes', to_jsonb(c.scopes),
                'effective_scopes', to_jsonb(ARRAY(SELECT s FROM unnest(c.scopes) s
                    WHERE EXISTS (SELECT 1 FROM querylayer.agent_site_permissions p
                                   WHERE p.site_id = c.site_id AND p.agent_id = c.agent_id AND p.scope = s) ORDER BY s)),
                'harness', c.harness, 'expires_at', c.expires_at,
                'state', CASE WHEN c.revoked_at IS NOT NULL THEN 'revoked' WHEN c.expires_at <= now() THEN 'expired' ELSE 'active' END,
                'budgets', querylayer.budgets_json(c.id),
                'created_at', c.created_at, 'revoked_at', c.revoked_at)) ORDER BY c.created_at DESC, c.id DESC)
          FROM (SELECT * FROM querylayer.connections x
                 WHERE x.site_id = querylayer.ctx_site_id()
                   AND (v_after.after_id IS NULL
                        OR (x.created_at, x.id) < (v_after.after_key::timestamptz, v_after.after_id))
                 ORDER BY x.created_at DESC, x.id DESC LIMIT p_limit + 1) c
          JOIN querylayer.agents a ON a.id = c.agent_id));
END
$$;

CREATE FUNCTION querylayer_api.console_create_connection(
    p_agent text, p_name text, p_scopes text[], p_expires_at timestamptz, p_harness text DEFAULT 'generic',
    p_did text DEFAULT NULL, p_did_proof jsonb DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_agent querylayer.agents;
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']);
    v_agent := querylayer.agent_by_handle(querylayer.ctx_organization_id(), p_agent);
    -- A did:key is public. A member may bind a key that is new or already their organization's;
    -- one that another organization has used only an operator binds, so no site can take over
    -- another organization's agent key while that organization's binding is not live.
    IF p_did IS NOT NULL AND EXISTS (
        SELECT 1 FROM unnest(querylayer.did_key_organizations(p_did)) AS o(id)
         WHERE o.id <> querylayer.ctx_organization_id()) THEN
        RAISE EXCEPTION 'did:key % cannot be bound from the console', p_did USING ERRCODE = 'QL409',
            HINT = 'ask an operator to bind it (querylayer admin create-connection --did)';
    END IF;
    RETURN querylayer.issue_connection(querylayer.ctx_site_id(), v_agent.id, p_name, p_scopes, p_expires_at,
                                       p_harness, 'member:' || querylayer.ctx_member_id(), p_did, true, p_did_proof);
END
$$;

CREATE FUNCTION querylayer_api.console_revoke_connection(p_connection_id uuid, p_reason text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']);
    RETURN querylayer.revoke_credential('querylayer.connections'::regclass, p_connection_id, p_reason);
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.console_list_connections, querylayer_api.console_create_connection,
    querylayer_api.console_revoke_connection TO querylayer_edge;
