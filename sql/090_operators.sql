-- Operator functions: what a DBA holding querylayer_admin runs in psql (and what
-- `querylayer admin …` calls). Each enters the operator context, which the extension grants only
-- when the role calling in from outside is querylayer_admin (or a superuser).

-- Ends every backend acting as a member on a site right now (through a member token or a
-- dashboard session), so that a change of the member's role is seen at once.
CREATE FUNCTION querylayer.end_member_credentials(p_site_id uuid, p_member_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM querylayer.end_credential_sessions(t.id)
       FROM querylayer.member_tokens t
      WHERE t.site_id = p_site_id AND t.member_id = p_member_id AND t.revoked_at IS NULL AND t.expires_at > clock_timestamp();
    -- Dashboard sessions exist from sql/175_dashboard.sql on; this runs only after it.
    PERFORM querylayer.end_credential_sessions(s.id)
       FROM querylayer.member_sessions s
      WHERE s.site_id = p_site_id AND s.member_id = p_member_id AND s.revoked_at IS NULL AND s.expires_at > clock_timestamp();
END
$$;

CREATE FUNCTION querylayer_api.create_organization(p_slug text, p_name text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v querylayer.organizations;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    INSERT INTO querylayer.organizations (slug, name)
    VALUES (querylayer.check_slug(p_slug, 'organization slug'::text), coalesce(p_name, p_slug))
    RETURNING * INTO v;
    PERFORM querylayer.audit('organization.create'::text, v.id::text, jsonb_build_object('slug', v.slug));
    RETURN jsonb_build_object('organization_id', v.id, 'slug', v.slug, 'name', v.name);
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'an organization with slug % already exists', quote_literal(p_slug) USING ERRCODE = 'QL409';
END
$$;

CREATE FUNCTION querylayer_api.create_site(p_organization text, p_slug text, p_name text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org  querylayer.organizations;
    v_site querylayer.sites;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    v_org := querylayer.organization_by_slug(p_organization);
    IF EXISTS (SELECT 1 FROM querylayer.sites WHERE slug = p_slug) THEN
        RAISE EXCEPTION 'a site with slug % already exists', quote_literal(p_slug) USING ERRCODE = 'QL409';
    END IF;
    INSERT INTO querylayer.sites (organization_id, slug, name)
    VALUES (v_org.id, querylayer.check_slug(p_slug, 'site slug'::text), coalesce(p_name, p_slug))
    RETURNING * INTO v_site;
    PERFORM querylayer.enter_operator(v_site.id);
    INSERT INTO querylayer.ledger_heads (site_id, seq, head) VALUES (v_site.id, 0, querylayer.ledger_genesis(v_site.id));
    PERFORM querylayer.audit('site.create'::text, v_site.id::text, jsonb_build_object('slug', v_site.slug));
    RETURN jsonb_build_object('site_id', v_site.id, 'slug', v_site.slug, 'name', v_site.name,
                              'organization', v_org.slug);
END
$$;

CREATE FUNCTION querylayer_api.create_member(p_organization text, p_handle text, p_display_name text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org querylayer.organizations;
    v     querylayer.members;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    v_org := querylayer.organization_by_slug(p_organization);
    IF p_handle IS NULL OR p_handle !~ '^[a-z0-9][a-z0-9._-]{0,62}$' THEN
        RAISE EXCEPTION 'invalid member handle %', coalesce(quote_literal(p_handle), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM querylayer.members WHERE organization_id = v_org.id AND handle = p_handle) THEN
        RAISE EXCEPTION 'a member with handle % already exists in %', quote_literal(p_handle), v_org.slug USING ERRCODE = 'QL409';
    END IF;
    INSERT INTO querylayer.members (organization_id, handle, display_name)
    VALUES (v_org.id, p_handle, coalesce(p_display_name, p_handle))
    RETURNING * INTO v;
    PERFORM querylayer.audit('member.create'::text, v.id::text, jsonb_build_object('handle', v.handle));
    RETURN jsonb_build_object('member_id', v.id, 'handle', v.handle, 'display_name', v.display_name,
                              'organization', v_org.slug);
END
$$;

-- Sets a member's role on a site (owner, admin, editor, viewer), or removes it with NULL.
CREATE FUNCTION querylayer_api.set_member_role(p_site text, p_member text, p_role text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site   querylayer.sites;
    v_member querylayer.members;
    v_old    text;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    v_member := querylayer.member_by_handle(v_site.organization_id, p_member);
    IF p_role IS NOT NULL AND p_role NOT IN ('owner', 'admin', 'editor', 'viewer') THEN
        RAISE EXCEPTION 'role must be owner, admin, editor or viewer; got %', quote_literal(p_role) USING ERRCODE = '22023';
    END IF;
    SELECT role INTO v_old FROM querylayer.site_members WHERE site_id = v_site.id AND member_id = v_member.id FOR UPDATE;
    IF p_role IS NULL THEN
        DELETE FROM querylayer.site_members WHERE site_id = v_site.id AND member_id = v_member.id;
    ELSE
        INSERT INTO querylayer.site_members (site_id, member_id, role) VALUES (v_site.id, v_member.id, p_role)
        ON CONFLICT (site_id, member_id) DO UPDATE SET role = EXCLUDED.role, granted_at = now();
    END IF;
    IF v_old IS DISTINCT FROM p_role THEN
        -- A member acting with the old role right now stops: their tokens' sessions end.
        PERFORM querylayer.end_member_credentials(v_site.id, v_member.id);
    END IF;
    PERFORM querylayer.audit('member.role'::text, v_member.id::text, jsonb_build_object('role', p_role));
    RETURN jsonb_build_object('site', v_site.slug, 'member', v_member.handle, 'role', p_role);
END
$$;

CREATE FUNCTION querylayer_api.create_agent(
    p_organization text, p_handle text, p_kind text DEFAULT 'generic',
    p_profile_id text DEFAULT NULL, p_profile_name text DEFAULT NULL, p_principal text DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org querylayer.organizations;
    v     querylayer.agents;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    v_org := querylayer.organization_by_slug(p_organization);
    IF p_handle IS NULL OR p_handle !~ '^[a-z0-9][a-z0-9._-]{0,62}$' THEN
        RAISE EXCEPTION 'invalid agent handle %', coalesce(quote_literal(p_handle), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF coalesce(p_kind, 'generic') NOT IN ('generic', 'hermes') THEN
        RAISE EXCEPTION 'agent kind must be generic or hermes; got %', quote_literal(p_kind) USING ERRCODE = '22023';
    END IF;
    IF p_kind = 'hermes' AND (p_profile_id IS NULL OR p_profile_name IS NULL) THEN
        RAISE EXCEPTION 'a hermes agent needs its immutable profile_id and its current profile_name' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM querylayer.agents WHERE organization_id = v_org.id AND handle = p_handle) THEN
        RAISE EXCEPTION 'an agent with handle % already exists in %', quote_literal(p_handle), v_org.slug USING ERRCODE = 'QL409';
    END IF;
    IF p_profile_id IS NOT NULL AND EXISTS (SELECT 1 FROM querylayer.agents WHERE profile_id = p_profile_id) THEN
        RAISE EXCEPTION 'profile_id % is already bound to an agent', quote_literal(p_profile_id) USING ERRCODE = 'QL409';
    END IF;
    IF EXISTS (SELECT 1 FROM querylayer.agents WHERE organization_id = v_org.id AND principal = coalesce(p_principal, p_handle)) THEN
        RAISE EXCEPTION 'principal % is already an agent of %', quote_literal(coalesce(p_principal, p_handle)), v_org.slug
            USING ERRCODE = 'QL409';
    END IF;
    INSERT INTO querylayer.agents (organization_id, handle, kind, profile_id, profile_name, principal)
    VALUES (v_org.id, p_handle, coalesce(p_kind, 'generic'), p_profile_id, p_profile_name, coalesce(p_principal, p_handle))
    RETURNING * INTO v;
    PERFORM querylayer.audit('agent.create'::text, v.id::text,
        jsonb_build_object('handle', v.handle, 'kind', v.kind, 'profile_id', v.profile_id));
    RETURN jsonb_build_object('agent_id', v.id, 'handle', v.handle, 'kind', v.kind, 'principal', v.principal,
                              'profile_id', v.profile_id, 'profile_name', v.profile_name, 'organization', v_org.slug);
END
$$;

-- Renames a Hermes profile: the route changes, the identity (and everything bound to it) does not.
CREATE FUNCTION querylayer_api.rename_agent_profile(p_profile_id text, p_new_name text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v   querylayer.agents;
    v_old text;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    IF p_new_name IS NULL OR length(p_new_name) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'the new profile name must have 1 to 200 characters' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v FROM querylayer.agents WHERE profile_id = p_profile_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no agent is bound to profile_id %', coalesce(quote_literal(p_profile_id), 'NULL')
            USING ERRCODE = 'QL404', HINT = 'profiles are matched by their immutable id only';
    END IF;
    v_old := v.profile_name;
    UPDATE querylayer.agents SET profile_name = p_new_name WHERE id = v.id;
    INSERT INTO querylayer.agent_profile_renames (organization_id, agent_id, profile_id, old_name, new_name, renamed_by)
    VALUES (v.organization_id, v.id, v.profile_id, v_old, p_new_name, querylayer.outer_user());
    PERFORM querylayer.audit('agent.rename_profile'::text, v.id::text,
        jsonb_build_object('profile_id', v.profile_id, 'old_name', v_old, 'new_name', p_new_name));
    RETURN jsonb_build_object('agent_id', v.id, 'handle', v.handle, 'profile_id', v.profile_id,
                              'old_name', v_old, 'profile_name', p_new_name);
END
$$;

-- Resolves a Hermes profile for routing. By id: exact. By name: exactly one agent carries it,
-- or the lookup fails; nothing resolves to a similarly named agent.
CREATE FUNCTION querylayer_api.resolve_agent_profile(p_profile_id text DEFAULT NULL, p_profile_name text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v   querylayer.agents;
    v_n integer;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    IF (p_profile_id IS NULL) = (p_profile_name IS NULL) THEN
        RAISE EXCEPTION 'give exactly one of profile_id or profile_name' USING ERRCODE = '22023';
    END IF;
    IF p_profile_id IS NOT NULL THEN
        v := querylayer.agent_by_profile_id(p_profile_id);
    ELSE
        SELECT count(*) INTO v_n FROM querylayer.agents WHERE profile_name = p_profile_name;
        IF v_n = 0 THEN
            RAISE EXCEPTION 'no agent routes to profile name %', quote_literal(p_profile_name) USING ERRCODE = 'QL404';
        ELSIF v_n > 1 THEN
            RAISE EXCEPTION 'profile name % is ambiguous (% agents); resolve by profile_id', quote_literal(p_profile_name), v_n
                USING ERRCODE = 'QL409';
        END IF;
        SELECT * INTO v FROM querylayer.agents WHERE profile_name = p_profile_name;
    END IF;
    RETURN jsonb_build_object('agent_id', v.id, 'handle', v.handle, 'kind', v.kind,
                              'profile_id', v.profile_id, 'profile_name', v.profile_name);
END
$$;

CREATE FUNCTION querylayer_api.grant_agent_scopes(p_site text, p_agent text, p_scopes text[]) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    RETURN jsonb_build_object('site', v_site.slug)
        || querylayer.change_agent_scopes(v_site.id, querylayer.agent_by_handle(v_site.organization_id, p_agent),
                                          p_scopes, true, querylayer.outer_user());
END
$$;

-- Removing a permission removes that scope from the agent's existing connections at once
-- (connections are re-checked against permissions at every authentication).
CREATE FUNCTION querylayer_api.revoke_agent_scopes(p_site text, p_agent text, p_scopes text[]) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    RETURN jsonb_build_object('site', v_site.slug)
        || querylayer.change_agent_scopes(v_site.id, querylayer.agent_by_handle(v_site.organization_id, p_agent),
                                          p_scopes, false, NULL::text);
END
$$;

-- Walks the site's hash chain and reports the first broken link.
CREATE FUNCTION querylayer_api.verify_ledger(p_site text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    RETURN jsonb_build_object('site', v_site.slug) || querylayer.verify_ledger_site(v_site.id);
END
$$;

CREATE FUNCTION querylayer_api.list_audit(p_site text DEFAULT NULL, p_limit integer DEFAULT 100)
RETURNS TABLE (at timestamptz, site text, principal_kind text, agent_id uuid, connection_id uuid, member_id uuid,
               operator_role text, action text, outcome text, target text, detail jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    PERFORM querylayer.page_limit(p_limit);
    IF p_site IS NOT NULL THEN
        v_site := querylayer.enter_operator_site(p_site);
    END IF;
    RETURN QUERY
    SELECT e.at, v_site.slug, e.principal_kind, e.agent_id, e.connection_id, e.member_id, e.operator_role,
           e.action, e.outcome, e.target, e.detail
      FROM querylayer.audit_events e
     WHERE e.site_id IS NOT DISTINCT FROM v_site.id
     ORDER BY e.id DESC LIMIT p_limit;
END
$$;

-- The demo: organization demo, site demo, agent demo-agent holding every scope, member
-- demo-owner (owner of demo). Idempotent; every call issues a fresh connection secret and
-- member token (24 hours) and returns them.
CREATE FUNCTION querylayer_api.seed_demo() RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site  querylayer.sites;
    v_agent querylayer.agents;
    v_owner querylayer.members;
    v_suffix text := to_char(clock_timestamp(), 'YYYYMMDD"T"HH24MISS.US');
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    IF NOT EXISTS (SELECT 1 FROM querylayer.organizations WHERE slug = 'demo') THEN
        PERFORM querylayer_api.create_organization('demo'::text, 'Demo organization'::text);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM querylayer.sites WHERE slug = 'demo') THEN
        PERFORM querylayer_api.create_site('demo'::text, 'demo'::text, 'Demo site'::text);
    END IF;
    v_site := querylayer.enter_operator_site('demo'::text);
    IF NOT EXISTS (SELECT 1 FROM querylayer.agents WHERE organization_id = v_site.organization_id AND handle = 'demo-agent') THEN
        PERFORM querylayer_api.create_agent('demo'::text, 'demo-agent'::text, 'hermes'::text, 'demo-profile-0001'::text, 'demo'::text,
                                            'did:example:qg-navigator'::text);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM querylayer.members WHERE organization_id = v_site.organization_id AND handle = 'demo-owner') THEN
        PERFORM querylayer_api.create_member('demo'::text, 'demo-owner'::text, 'Demo owner'::text);
    END IF;
    PERFORM querylayer_api.set_member_role('demo'::text, 'demo-owner'::text, 'owner'::text);
    PERFORM querylayer_api.grant_agent_scopes('demo'::text, 'demo-agent'::text, ARRAY(SELECT scope FROM querylayer.scopes));
    PERFORM querylayer.enter_operator(v_site.id);
    IF NOT EXISTS (SELECT 1 FROM querylayer.templates WHERE site_id = v_site.id AND name = 'article') THEN
        PERFORM querylayer_api.create_template('demo'::text, 'article'::text,
            '[{"name": "title", "type": "text", "required": true, "max_length": 200},
              {"name": "body", "type": "markdown", "required": true},
              {"name": "summary", "type": "text", "required": false, "max_length": 500},
              {"name": "tags", "type": "list", "required": false}]'::jsonb);
    END IF;
    PERFORM querylayer.seed_demo_semantics(v_site.id);
    RETURN jsonb_build_object(
        'organization', 'demo', 'site', 'demo', 'agent', 'demo-agent', 'member', 'demo-owner',
        'connection', querylayer_api.create_connection('demo'::text, 'demo-agent'::text, 'demo ' || v_suffix,
                          ARRAY(SELECT scope FROM querylayer.scopes), now() + interval '24 hours', 'generic'::text),
        'member_token', querylayer_api.create_member_token('demo'::text, 'demo-owner'::text, 'demo ' || v_suffix,
                          now() + interval '24 hours'));
END
$$;

-- The members of an organization (p_organization), or those holding a role on a site (p_site,
-- with the role): one page of p_limit, by handle, and the cursor of the next. Never a password,
-- a token or a session.
CREATE FUNCTION querylayer_api.list_members(p_organization text DEFAULT NULL, p_site text DEFAULT NULL,
                                            p_limit integer DEFAULT 100, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org   querylayer.organizations;
    v_site  querylayer.sites;
    v_after record;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    PERFORM querylayer.page_limit(p_limit);
    IF (p_organization IS NULL) = (p_site IS NULL) THEN
        RAISE EXCEPTION 'give exactly one of organization or site' USING ERRCODE = '22023';
    END IF;
    v_after := querylayer.page_after('members'::text, p_cursor);
    IF p_site IS NULL THEN
        v_org := querylayer.organization_by_slug(p_organization);
        RETURN jsonb_build_object('organization', v_org.slug) || querylayer.page('members'::text, 'members'::text, p_limit, (
            SELECT jsonb_agg(jsonb_build_object('key', m.handle, 'id', m.id, 'item', jsonb_build_object(
                       'member_id', m.id, 'handle', m.handle, 'display_name', m.display_name,
                       'created_at', m.created_at)) ORDER BY m.handle, m.id)
              FROM (SELECT * FROM querylayer.members x
                     WHERE x.organization_id = v_org.id
                       AND (v_after.after_id IS NULL OR (x.handle, x.id) > (v_after.after_key, v_after.after_id))
                     ORDER BY x.handle, x.id LIMIT p_limit + 1) m));
    END IF;
    v_site := querylayer.enter_operator_site(p_site);
    RETURN jsonb_build_object('site', v_site.slug) || querylayer.page('members'::text, 'members'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', m.handle, 'id', m.id, 'item', jsonb_build_object(
                   'member_id', m.id, 'handle', m.handle, 'display_name', m.display_name,
                   'role', m.role, 'granted_at', m.granted_at, 'created_at', m.created_at)) ORDER BY m.handle, m.id)
          FROM (SELECT x.*, r.role, r.granted_at
                  FROM querylayer.members x JOIN querylayer.site_members r ON r.member_id = x.id AND r.site_id = v_site.id
                 WHERE v_after.after_id IS NULL OR (x.handle, x.id) > (v_after.after_key, v_after.after_id)
                 ORDER BY x.handle, x.id LIMIT p_limit + 1) m));
END
$$;

-- The agents of an organization (p_organization), or those holding a permission on a site
-- (p_site, with their scopes there and how many of their connections are active): one page of
-- p_limit, by handle, and the cursor of the next. Never a secret.
CREATE FUNCTION querylayer_api.list_agents(p_organization text DEFAULT NULL, p_site text DEFAULT NULL,
                                           p_limit integer DEFAULT 100, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org   querylayer.organizations;
    v_site  querylayer.sites;
    v_after record;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    PERFORM querylayer.page_limit(p_limit);
    IF (p_organization IS NULL) = (p_site IS NULL) THEN
        RAISE EXCEPTION 'give exactly one of organization or site' USING ERRCODE = '22023';
    END IF;
    v_after := querylayer.page_after('agents'::text, p_cursor);
    IF p_site IS NULL THEN
        v_org := querylayer.organization_by_slug(p_organization);
        RETURN jsonb_build_object('organization', v_org.slug) || querylayer.page('agents'::text, 'agents'::text, p_limit, (
            SELECT jsonb_agg(jsonb_build_object('key', a.handle, 'id', a.id, 'item', jsonb_build_object(
                       'agent_id', a.id, 'handle', a.handle, 'kind', a.kind, 'principal', a.principal,
                       'profile_id', a.profile_id, 'profile_name', a.profile_name,
                       'created_at', a.created_at)) ORDER BY a.handle, a.id)
              FROM (SELECT * FROM querylayer.agents x
                     WHERE x.organization_id = v_org.id
                       AND (v_after.after_id IS NULL OR (x.handle, x.id) > (v_after.after_key, v_after.after_id))
                     ORDER BY x.handle, x.id LIMIT p_limit + 1) a));
    END IF;
    v_site := querylayer.enter_operator_site(p_site);
    RETURN jsonb_build_object('site', v_site.slug) || querylayer.page('agents'::text, 'agents'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', a.handle, 'id', a.id, 'item', jsonb_build_object(
                   'agent_id', a.id, 'handle', a.handle, 'kind', a.kind, 'principal', a.principal,
                   'profile_id', a.profile_id, 'profile_name', a.profile_name,
                   'scopes', to_jsonb(ARRAY(SELECT p.scope FROM querylayer.agent_site_permissions p
                                             WHERE p.site_id = v_site.id AND p.agent_id = a.id ORDER BY p.scope)),
                   'active_connections', (SELECT count(*) FROM querylayer.connections c
                                           WHERE c.site_id = v_site.id AND c.agent_id = a.id AND c.revoked_at IS NULL
                                             AND c.expires_at > now()),
                   'created_at', a.created_at)) ORDER BY a.handle, a.id)
          FROM (SELECT * FROM querylayer.agents x
                 WHERE x.organization_id = v_site.organization_id
                   AND EXISTS (SELECT 1 FROM querylayer.agent_site_permissions p WHERE p.site_id = v_site.id AND p.agent_id = x.id)
                   AND (v_after.after_id IS NULL OR (x.handle, x.id) > (v_after.after_key, v_after.after_id))
                 ORDER BY x.handle, x.id LIMIT p_limit + 1) a));
END
$$;
