-- The member console: what a human does through /api/console — read proposals and runs, decide
-- (080_proposals.sql), and manage the site's agent connections (owner and admin only) — plus
-- the edge's audit of tool calls.

CREATE FUNCTION querylayer_api.console_list_proposals(p_state text DEFAULT 'pending', p_limit integer DEFAULT 50,
                                                      p_cursor text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    RETURN querylayer.list_proposals(p_state, p_limit, p_cursor);
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

-- A challenge for binding a did:key on the member's site (owner, admin): the key's holder signs
-- it, and console_create_connection takes the signature as the proof of possession.
CREATE FUNCTION querylayer_api.console_create_did_challenge(p_did text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']);
    RETURN querylayer.issue_did_challenge(querylayer.ctx_site_id(), p_did, 'member:' || querylayer.ctx_member_id());
END
$$;

CREATE FUNCTION querylayer_api.console_revoke_connection(p_connection_id uuid, p_reason text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']);
    RETURN querylayer.revoke_credential('querylayer.connections'::regclass, p_connection_id, p_reason);
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.console_list_proposals, querylayer_api.console_list_connections,
    querylayer_api.console_create_connection, querylayer_api.console_revoke_connection,
    querylayer_api.console_create_did_challenge TO querylayer_edge;
