-- Identity: organizations, sites, members and their site roles, agents and their per-site
-- permissions. A Hermes agent is bound by its immutable profile_id; profile_name is only a
-- routing attribute whose renames are recorded and never create a new identity.

CREATE FUNCTION querylayer.check_slug(p_value text, p_what text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_value IS NULL OR p_value !~ '^[a-z0-9][a-z0-9-]{0,62}$' THEN
        RAISE EXCEPTION 'invalid %: % (use 1-63 lowercase letters, digits and dashes)', p_what, coalesce(quote_literal(p_value), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    RETURN p_value;
END
$$;

CREATE TABLE querylayer.organizations (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    slug       text NOT NULL UNIQUE CHECK (slug ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at timestamptz NOT NULL DEFAULT now()
);
SELECT querylayer.isolate_by_organization('querylayer.organizations'::regclass, 'id'::name);
SELECT querylayer.decides_liveness('querylayer.organizations'::regclass);

CREATE TABLE querylayer.sites (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    slug            text NOT NULL UNIQUE CHECK (slug ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    name            text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (id, organization_id)
);
ALTER TABLE querylayer.sites ENABLE ROW LEVEL SECURITY;
ALTER TABLE querylayer.sites FORCE ROW LEVEL SECURITY;
CREATE POLICY site_isolation ON querylayer.sites
    USING (querylayer.ctx_is_operator() OR id = querylayer.ctx_site_id())
    WITH CHECK (querylayer.ctx_is_operator());
SELECT querylayer.decides_liveness('querylayer.sites'::regclass);

ALTER TABLE querylayer.ledger_heads
    ADD FOREIGN KEY (site_id) REFERENCES querylayer.sites ON DELETE RESTRICT;
SELECT querylayer.isolate_by_site('querylayer.ledger_heads'::regclass);
ALTER TABLE querylayer.ledger_pending
    ADD FOREIGN KEY (site_id) REFERENCES querylayer.sites ON DELETE RESTRICT;
ALTER TABLE querylayer.ledger_pending ENABLE ROW LEVEL SECURITY;
ALTER TABLE querylayer.ledger_pending FORCE ROW LEVEL SECURITY;
-- A site's writers add its entries and its sealers remove them; operators see every site's (the
-- worker finds the sites that have any).
CREATE POLICY site_isolation ON querylayer.ledger_pending
    USING (site_id = querylayer.ctx_site_id() OR querylayer.ctx_is_operator())
    WITH CHECK (site_id = querylayer.ctx_site_id());

CREATE TABLE querylayer.members (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    handle          text NOT NULL CHECK (handle ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    display_name    text NOT NULL CHECK (length(display_name) BETWEEN 1 AND 200),
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (organization_id, handle)
);
SELECT querylayer.isolate_by_organization('querylayer.members'::regclass);

CREATE TABLE querylayer.site_members (
    site_id    uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    member_id  uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    role       text NOT NULL CHECK (role IN ('owner', 'admin', 'editor', 'viewer')),
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (site_id, member_id)
);
SELECT querylayer.isolate_by_site('querylayer.site_members'::regclass);

CREATE TABLE querylayer.agents (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    handle          text NOT NULL CHECK (handle ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    kind            text NOT NULL DEFAULT 'generic' CHECK (kind IN ('generic', 'hermes')),
    profile_id      text UNIQUE CHECK (profile_id ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    profile_name    text CHECK (length(profile_name) BETWEEN 1 AND 200),
    -- The subject this agent is in rights documents (RBAC grants, ODRL assignees); the handle
    -- unless an operator names another (a DID, say) when registering the agent.
    principal       text NOT NULL CHECK (length(principal) BETWEEN 1 AND 300),
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (organization_id, handle),
    UNIQUE (organization_id, principal),
    UNIQUE (id, organization_id),
    CHECK (kind <> 'hermes' OR (profile_id IS NOT NULL AND profile_name IS NOT NULL))
);
SELECT querylayer.isolate_by_organization('querylayer.agents'::regclass);
SELECT querylayer.decides_liveness('querylayer.agents'::regclass);
CREATE INDEX agents_profile_name ON querylayer.agents (profile_name);

-- Everything about an agent is its identity except the routing name of its Hermes profile.
CREATE FUNCTION querylayer.agents_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'agents are never deleted; revoke their permissions and connections instead' USING ERRCODE = 'QL423';
    END IF;
    IF (NEW.id, NEW.organization_id, NEW.handle, NEW.kind, NEW.profile_id, NEW.principal, NEW.created_at)
       IS DISTINCT FROM (OLD.id, OLD.organization_id, OLD.handle, OLD.kind, OLD.profile_id, OLD.principal, OLD.created_at) THEN
        RAISE EXCEPTION 'an agent''s identity is immutable; only profile_name may change (through rename_agent_profile)'
            USING ERRCODE = 'QL423';
    END IF;
    RETURN NEW;
END
$$;
SELECT querylayer.guard_rows('querylayer.agents'::regclass, 'querylayer.agents_guard'::regproc, false);

CREATE TABLE querylayer.agent_profile_renames (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    agent_id        uuid NOT NULL REFERENCES querylayer.agents ON DELETE RESTRICT,
    profile_id      text NOT NULL,
    old_name        text,
    new_name        text NOT NULL,
    renamed_at      timestamptz NOT NULL DEFAULT now(),
    renamed_by      text NOT NULL
);
SELECT querylayer.isolate_by_organization('querylayer.agent_profile_renames'::regclass);
SELECT querylayer.make_append_only('querylayer.agent_profile_renames'::regclass);

-- An agent holds permissions only on sites of its own organization (the composite keys say so).
CREATE TABLE querylayer.agent_site_permissions (
    site_id         uuid NOT NULL,
    organization_id uuid NOT NULL,
    agent_id        uuid NOT NULL,
    scope           text NOT NULL REFERENCES querylayer.scopes ON DELETE RESTRICT,
    granted_at      timestamptz NOT NULL DEFAULT now(),
    granted_by      text NOT NULL,
    PRIMARY KEY (site_id, agent_id, scope),
    FOREIGN KEY (site_id, organization_id) REFERENCES querylayer.sites (id, organization_id) ON DELETE RESTRICT,
    FOREIGN KEY (agent_id, organization_id) REFERENCES querylayer.agents (id, organization_id) ON DELETE RESTRICT
);
SELECT querylayer.isolate_by_site('querylayer.agent_site_permissions'::regclass);
SELECT querylayer.decides_liveness('querylayer.agent_site_permissions'::regclass);

-- Lookups used by operator functions; all fail closed with an error naming what was not found.
CREATE FUNCTION querylayer.organization_by_slug(p_slug text) RETURNS querylayer.organizations
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v querylayer.organizations;
BEGIN
    SELECT * INTO v FROM querylayer.organizations WHERE slug = p_slug;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no organization with slug %', quote_literal(p_slug) USING ERRCODE = 'QL404';
    END IF;
    RETURN v;
END
$$;

CREATE FUNCTION querylayer.site_by_slug(p_slug text) RETURNS querylayer.sites
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v querylayer.sites;
BEGIN
    SELECT * INTO v FROM querylayer.sites WHERE slug = p_slug;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no site with slug %', quote_literal(p_slug) USING ERRCODE = 'QL404';
    END IF;
    RETURN v;
END
$$;

-- The operator preamble of a function that names its site: enters the operator context (refused
-- to anyone but querylayer_admin or querylayer_worker), finds the site by its slug (QL404 when
-- there is none), then enters the operator context for that site. Identity tables stay readable
-- to the operator in the site's context, so lookups of its agents and members may follow.
CREATE FUNCTION querylayer.enter_operator_site(p_slug text) RETURNS querylayer.sites
LANGUAGE plpgsql AS $$
DECLARE
    v querylayer.sites;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    v := querylayer.site_by_slug(p_slug);
    PERFORM querylayer.enter_operator(v.id);
    RETURN v;
END
$$;

CREATE FUNCTION querylayer.agent_by_handle(p_organization_id uuid, p_handle text) RETURNS querylayer.agents
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v querylayer.agents;
BEGIN
    SELECT * INTO v FROM querylayer.agents WHERE organization_id = p_organization_id AND handle = p_handle;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no agent with handle % in this organization', quote_literal(p_handle) USING ERRCODE = 'QL404';
    END IF;
    RETURN v;
END
$$;

-- Grants (p_grant) or withdraws an agent's scopes on a site, for an operator or a member (p_by
-- names who, for a grant's row); a withdrawn scope ends the agent's sessions acting with it at
-- once. Audited; answers the agent and the scopes it now holds there.
CREATE FUNCTION querylayer.change_agent_scopes(p_site_id uuid, p_agent querylayer.agents, p_scopes text[],
                                               p_grant boolean, p_by text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_scopes text[] := querylayer.normalize_scopes(p_scopes);
BEGIN
    IF p_grant THEN
        INSERT INTO querylayer.agent_site_permissions (site_id, organization_id, agent_id, scope, granted_by)
        SELECT p_site_id, p_agent.organization_id, p_agent.id, s, p_by FROM unnest(v_scopes) AS s
        ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM querylayer.agent_site_permissions
         WHERE site_id = p_site_id AND agent_id = p_agent.id AND scope = ANY (v_scopes);
        -- A connection acting with a withdrawn scope right now stops: its sessions end.
        PERFORM querylayer.end_credential_sessions(c.id)
           FROM querylayer.connections c
          WHERE c.site_id = p_site_id AND c.agent_id = p_agent.id AND c.revoked_at IS NULL
            AND c.expires_at > clock_timestamp() AND c.scopes && v_scopes;
    END IF;
    PERFORM querylayer.audit(CASE WHEN p_grant THEN 'agent.grant' ELSE 'agent.revoke' END, p_agent.id::text,
                             jsonb_build_object('scopes', v_scopes));
    RETURN jsonb_build_object('agent', p_agent.handle,
        'scopes', (SELECT coalesce(to_jsonb(array_agg(scope ORDER BY scope)), '[]') FROM querylayer.agent_site_permissions
                    WHERE site_id = p_site_id AND agent_id = p_agent.id));
END
$$;

CREATE FUNCTION querylayer.member_by_handle(p_organization_id uuid, p_handle text) RETURNS querylayer.members
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v querylayer.members;
BEGIN
    SELECT * INTO v FROM querylayer.members WHERE organization_id = p_organization_id AND handle = p_handle;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no member with handle % in this organization', quote_literal(p_handle) USING ERRCODE = 'QL404';
    END IF;
    RETURN v;
END
$$;

-- Resolves a Hermes profile by its immutable id, exactly. Never by name, never approximately.
CREATE FUNCTION querylayer.agent_by_profile_id(p_profile_id text) RETURNS querylayer.agents
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v querylayer.agents;
BEGIN
    SELECT * INTO v FROM querylayer.agents WHERE profile_id = p_profile_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no agent is bound to profile_id %', coalesce(quote_literal(p_profile_id), 'NULL')
            USING ERRCODE = 'QL404', HINT = 'profiles are matched by their immutable id only';
    END IF;
    RETURN v;
END
$$;
