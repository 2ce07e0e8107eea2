-- Reading content: the templates a site offers (with their fields), an item with its live and
-- draft revisions, an item's revision history, and one proposal with what it would put live.
-- Agents read these under content:read, members through the console and the dashboard: the
-- same functions, so an approval is never given to text nobody could read.

-- The newest version of each template, with its fields and how many versions exist, by name,
-- `p_limit` at a time; `p_cursor` (the previous page's next_cursor) continues.
CREATE FUNCTION querylayer_api.list_templates(p_limit integer DEFAULT 100, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.require_principal('content:read'::text);
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('templates'::text, p_cursor);
    RETURN querylayer.page('templates'::text, 'templates'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', t.name, 'id', t.id, 'item', jsonb_build_object(
                'name', t.name, 'version', t.version, 'fields', t.fields, 'created_at', t.created_at,
                'versions', (SELECT count(*) FROM querylayer.templates o WHERE o.site_id = t.site_id AND o.name = t.name)))
                ORDER BY t.name)
          FROM (SELECT * FROM (SELECT DISTINCT ON (name) * FROM querylayer.templates
                                WHERE site_id = querylayer.ctx_site_id() ORDER BY name, version DESC) n
                 WHERE v_after.after_key IS NULL OR n.name > v_after.after_key
                 ORDER BY n.name LIMIT p_limit + 1) t));
END
$$;

-- One revision's summary (no fields): what a history lists.
CREATE FUNCTION querylayer.revision_summary(p_rev querylayer.content_revisions, p_item querylayer.content_items)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT jsonb_build_object(
        'revision_id', p_rev.id, 'revision_number', p_rev.revision_number,
        'template_version', t.version, 'title', p_rev.fields->>'title',
        'author', jsonb_build_object('kind', p_rev.author_kind, 'agent', a.handle, 'run_id', p_rev.run_id,
                                     'connection_id', p_rev.connection_id, 'member', m.handle),
        'created_at', p_rev.created_at,
        'is_draft', p_rev.id = p_item.draft_revision_id,
        'is_live', p_rev.id IS NOT DISTINCT FROM p_item.published_revision_id)
      FROM querylayer.templates t
      LEFT JOIN querylayer.agents a ON a.id = p_rev.agent_id
      LEFT JOIN querylayer.members m ON m.id = p_rev.member_id
     WHERE t.id = p_rev.template_id);
END
$$;

-- An item's revisions, newest first, `p_limit` at a time; `p_cursor` (the previous page's
-- next_cursor) continues.
CREATE FUNCTION querylayer_api.list_revisions(p_content_id uuid, p_limit integer DEFAULT 50, p_cursor text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_item  querylayer.content_items;
    v_after record;
BEGIN
    PERFORM querylayer.require_principal('content:read'::text);
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('revisions'::text, p_cursor);
    SELECT * INTO v_item FROM querylayer.content_items WHERE id = p_content_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'content_id: no content item % on this site', p_content_id USING ERRCODE = 'QL404';
    END IF;
    RETURN jsonb_build_object('content', querylayer.content_json(v_item)) || querylayer.page('revisions'::text, 'revisions'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', r.revision_number::text, 'id', r.id,
                                            'item', querylayer.revision_summary(r, v_item)) ORDER BY r.revision_number DESC)
          FROM (SELECT * FROM querylayer.content_revisions
                 WHERE content_id = p_content_id
                   AND (v_after.after_id IS NULL OR revision_number < v_after.after_key::integer)
                 ORDER BY revision_number DESC LIMIT p_limit + 1) r));
END
$$;

-- An item with its template and both revisions a reader cares about: the draft (what the next
-- publish would put live) and the live one.
CREATE FUNCTION querylayer_api.get_content(p_content_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_item querylayer.content_items;
BEGIN
    PERFORM querylayer.require_principal('content:read'::text);
    SELECT * INTO v_item FROM querylayer.content_items WHERE id = p_content_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'content_id: no content item % on this site', p_content_id USING ERRCODE = 'QL404';
    END IF;
    RETURN querylayer.content_json(v_item) || jsonb_build_object(
        'created_at', v_item.created_at,
        'draft', querylayer.revision_json(v_item.draft_revision_id),
        'live', querylayer.revision_json(v_item.published_revision_id),
        'template_fields', (querylayer.newest_template(v_item.site_id, v_item.template_name)).fields);
END
$$;

-- One proposal as a decider needs it: the card, the run and agent that made it, and for each
-- lifecycle item the item, the exact revision it would put live and what is live now.
CREATE FUNCTION querylayer_api.get_proposal(p_proposal_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_prop querylayer.proposals;
BEGIN
    PERFORM querylayer.require_principal('content:read'::text);
    SELECT * INTO v_prop FROM querylayer.proposals WHERE id = p_proposal_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'proposal_id: no proposal % on this site', p_proposal_id USING ERRCODE = 'QL404';
    END IF;
    RETURN querylayer.proposal_json(v_prop.id) || jsonb_build_object(
        'decider_roles', (SELECT to_jsonb(decider_roles) FROM querylayer.proposal_types WHERE type = v_prop.type),
        'agent', (SELECT handle FROM querylayer.agents WHERE id = v_prop.agent_id),
        'member', (SELECT handle FROM querylayer.members WHERE id = v_prop.member_id),
        'run', (SELECT querylayer.run_json(r) FROM querylayer.runs r WHERE r.id = v_prop.run_id),
        'details', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                        'content_id', c.id, 'slug', c.slug, 'state', querylayer.content_state(c), 'action', i.action,
                        'requested', querylayer.revision_json(i.revision_id),
                        'live', querylayer.revision_json(c.published_revision_id),
                        'current_draft_revision_id', c.draft_revision_id,
                        'problem', querylayer.lifecycle_problem(i, c)) ORDER BY i.ordinal), '[]')
                      FROM querylayer.proposal_items i JOIN querylayer.content_items c ON c.id = i.content_id
                     WHERE i.proposal_id = v_prop.id),
        -- create_content and revision cards name one revision in their payload.
        'revision', CASE WHEN v_prop.type IN ('create_content', 'revision')
                         THEN querylayer.revision_json((v_prop.payload->>'revision_id')::uuid) END);
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.list_templates, querylayer_api.list_revisions, querylayer_api.get_content,
    querylayer_api.get_proposal TO querylayer_edge;
