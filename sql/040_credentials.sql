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
CREATE TRIGGER connections_guard BEFORE UPDATE OR DELETE ON querylayer.connections
    FOR EACH ROW EXECUTE FUNCTION querylayer.credential_rows_guard();
ALTER TABLE querylayer.connections ENABLE ALWAYS TRIGGER connections_guard;
CREATE TRIGGER connections_no_truncate BEFORE TRUNCATE ON querylayer.connections
    FOR EACH STATEMENT EXECUTE FUNCTION querylayer.forbid_change();
ALTER TABLE querylayer.connections ENABLE ALWAYS TRIGGER connections_no_truncate;

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
CREATE TRIGGER member_tokens_guard BEFORE UPDATE OR DELETE ON querylayer.member_tokens
    FOR EACH ROW EXECUTE FUNCTION querylayer.credential_rows_guard();
ALTER TABLE querylayer.member_tokens ENABLE ALWAYS TRIGGER member_tokens_guard;
CREATE TRIGGER member_tokens_no_truncate BEFORE TRUNCATE ON querylayer.member_tokens
    FOR EACH STATEMENT EXECUTE FUNCTION querylayer.forbid_change();
ALTER TABLE querylayer.member_tokens ENABLE ALWAYS TRIGGER member_tokens_no_truncate;

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
