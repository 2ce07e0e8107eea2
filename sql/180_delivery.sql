-- Delivery: the read-only API a website fetches its published content from. Only live content
-- leaves here (an item's published revision, never a draft; an unpublished or archived item is
-- gone at the next request). A request acts as a per-site delivery token (qld_…, stored like any
-- credential: prefix plus SHA-256, shown once) that can read nothing else, or, when the site's
-- owner turned public delivery on, as nobody at all. extension/src/delivery.rs decides which
-- (querylayer_api.authenticate_delivery); the functions below serve only that context.

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
SELECT querylayer.guard_rows('querylayer.delivery_tokens'::regclass, 'querylayer.credential_rows_guard'::regproc, false);
INSERT INTO querylayer.value_limits (table_name, column_name, argument, max_bytes) VALUES
    ('delivery_tokens', 'revoked_reason', 'reason', 1000);
SELECT querylayer.limit_values('querylayer.delivery_tokens'::regclass, true);

-- A site's delivery settings. The row of a public site is found without any credential by the
-- SHA-256 of its slug, and only while the extension resolves exactly that slug.
CREATE TABLE querylayer.delivery_settings (
    site_id         uuid PRIMARY KEY REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    site_sha256     bytea NOT NULL UNIQUE CHECK (length(site_sha256) = 32),
    public          boolean NOT NULL DEFAULT false,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    updated_by      text NOT NULL
);
SELECT querylayer.isolate_by_site('querylayer.delivery_settings'::regclass);
CREATE POLICY public_site_lookup ON querylayer.delivery_settings FOR SELECT
    USING (public AND site_sha256 = querylayer.ctx_presented_fingerprint());

-- When the live set of a site last changed: the newest applied lifecycle execution.
CREATE INDEX proposal_executions_site_executed ON querylayer.proposal_executions (site_id, executed_at);

-- The lookup key of a public site (the extension computes the same from the requested slug).
CREATE FUNCTION querylayer.delivery_site_sha256(p_slug text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN pg_catalog.sha256(pg_catalog.convert_to('querylayer-delivery-site-v1:' || p_slug, 'UTF8'));
END
$$;

CREATE FUNCTION querylayer.require_delivery() RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF querylayer.ctx_kind() IS DISTINCT FROM 'delivery' THEN
        RAISE EXCEPTION 'no delivery context in this transaction'
            USING ERRCODE = 'QL401',
                  HINT = 'call querylayer_api.authenticate_delivery(site, fingerprint) first, in the same transaction';
    END IF;
END
$$;

-- Called by the extension while it resolves a delivery token (that token's site only).
CREATE FUNCTION querylayer.resolve_delivery_token(p_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r record;
BEGIN
    SELECT t.*, s.slug AS site_slug INTO r
      FROM querylayer.delivery_tokens t JOIN querylayer.sites s ON s.id = t.site_id
     WHERE t.id = p_id;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'unknown');
    ELSIF r.revoked_at IS NOT NULL THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'revoked');
    ELSIF r.expires_at <= clock_timestamp() THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'expired');
    END IF;
    RETURN jsonb_build_object('ok', true, 'organization_id', r.organization_id, 'site_id', r.site_id,
                              'site', r.site_slug, 'delivery_token_id', r.id, 'access', 'token',
                              'expires_at', r.expires_at);
END
$$;

CREATE FUNCTION querylayer.issue_delivery_token(p_site_id uuid, p_name text, p_expires_at timestamptz,
                                                p_created_by text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_site  querylayer.sites;
    v_token querylayer.delivery_tokens;
    v_new   record;
BEGIN
    SELECT * INTO v_site FROM querylayer.sites WHERE id = p_site_id;
    IF EXISTS (SELECT 1 FROM querylayer.delivery_tokens
                WHERE site_id = p_site_id AND name = p_name AND revoked_at IS NULL) THEN
        RAISE EXCEPTION 'name: a live delivery token named % already exists on this site', quote_literal(p_name)
            USING ERRCODE = 'QL409', HINT = 'revoke it first or choose another name';
    END IF;
    SELECT * INTO v_new FROM querylayer.new_secret('qld'::text);
    INSERT INTO querylayer.delivery_tokens (site_id, organization_id, name, prefix, expires_at, created_by)
    VALUES (p_site_id, v_site.organization_id, p_name, v_new.prefix, querylayer.check_expiry(p_expires_at), p_created_by)
    RETURNING * INTO v_token;
    INSERT INTO querylayer.credentials (fingerprint, kind, subject_id, site_id, organization_id)
    VALUES (v_new.fingerprint, 'delivery_token', v_token.id, v_token.site_id, v_token.organization_id);
    PERFORM querylayer.audit('delivery_token.create'::text, v_token.id::text,
        jsonb_build_object('name', v_token.name, 'expires_at', v_token.expires_at));
    RETURN jsonb_build_object('delivery_token_id', v_token.id, 'token', v_new.secret, 'prefix', v_token.prefix,
                              'name', v_token.name, 'site', v_site.slug, 'expires_at', v_token.expires_at);
END
$$;

CREATE FUNCTION querylayer.set_delivery_public(p_site_id uuid, p_public boolean, p_by text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    IF p_public IS NULL THEN
        RAISE EXCEPTION 'public must be true or false' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v_site FROM querylayer.sites WHERE id = p_site_id;
    INSERT INTO querylayer.delivery_settings (site_id, organization_id, site_sha256, public, updated_by)
    VALUES (v_site.id, v_site.organization_id, querylayer.delivery_site_sha256(v_site.slug), p_public, p_by)
    ON CONFLICT (site_id) DO UPDATE SET public = EXCLUDED.public, updated_at = now(), updated_by = EXCLUDED.updated_by;
    PERFORM querylayer.audit('delivery.public'::text, v_site.id::text, jsonb_build_object('public', p_public));
    RETURN jsonb_build_object('site', v_site.slug, 'public', p_public);
END
$$;

CREATE FUNCTION querylayer.delivery_tokens_json() RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN jsonb_build_object(
        'public', coalesce((SELECT public FROM querylayer.delivery_settings WHERE site_id = querylayer.ctx_site_id()), false),
        'tokens', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'delivery_token_id', t.id, 'name', t.name, 'prefix', t.prefix, 'expires_at', t.expires_at,
                       'created_at', t.created_at, 'revoked_at', t.revoked_at,
                       'state', CASE WHEN t.revoked_at IS NOT NULL THEN 'revoked'
                                     WHEN t.expires_at <= now() THEN 'expired' ELSE 'active' END)
                       ORDER BY t.created_at, t.id), '[]')
                     FROM querylayer.delivery_tokens t WHERE t.site_id = querylayer.ctx_site_id()));
END
$$;

-- A live item as the website receives it: the published revision's fields and the validators
-- of conditional requests. ETag: the revision and when it went live; Last-Modified: that time.
-- (delivery_items writes the same members in its query.)
CREATE FUNCTION querylayer.delivered_json(p_item querylayer.content_items, p_rev querylayer.content_revisions)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT jsonb_build_object(
        'slug', p_item.slug, 'template', t.name, 'template_version', t.version,
        'revision_id', p_rev.id, 'revision_number', p_rev.revision_number,
        'fields', p_rev.fields, 'published_at', p_item.published_at,
        'etag', '"' || left(encode(pg_catalog.sha256(pg_catalog.convert_to(
                    p_rev.id::text || '@' || extract(epoch FROM p_item.published_at)::text, 'UTF8')), 'hex'), 32) || '"',
        'last_modified', p_item.published_at)
      FROM querylayer.templates t WHERE t.id = p_rev.template_id);
END
$$;

-- -------------------------------------------------------------------------------------------
-- The delivery surface (after authenticate_delivery, in the same transaction).

-- One live item by slug; anything not live (a draft only, unpublished, archived) is not found.
CREATE FUNCTION querylayer_api.delivery_item(p_slug text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_item querylayer.content_items;
    v_rev  querylayer.content_revisions;
BEGIN
    PERFORM querylayer.require_delivery();
    SELECT * INTO v_item FROM querylayer.content_items
     WHERE site_id = querylayer.ctx_site_id() AND slug = p_slug
       AND published_revision_id IS NOT NULL AND archived_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'slug: nothing is published at % on this site', coalesce(quote_literal(p_slug), 'NULL')
            USING ERRCODE = 'QL404';
    END IF;
    SELECT * INTO v_rev FROM querylayer.content_revisions WHERE id = v_item.published_revision_id;
    RETURN querylayer.delivered_json(v_item, v_rev);
END
$$;

-- The live items by slug, `p_limit` at a time (1 to 100); `p_cursor` is the previous page's
-- next_cursor. ETag covers exactly the page; Last-Modified is when the site's live set last
-- changed (a publish, an unpublish, an archive), so a removal is never answered 304.
CREATE FUNCTION querylayer_api.delivery_items(p_limit integer DEFAULT 20, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after text;
    v_items jsonb;
BEGIN
    PERFORM querylayer.require_delivery();
    PERFORM querylayer.page_limit(p_limit, 100);
    IF p_cursor IS NOT NULL THEN
        BEGIN
            v_after := convert_from(decode(translate(p_cursor, '-_', '+/') ||
                                           repeat('=', (4 - length(p_cursor) % 4) % 4), 'base64'), 'UTF8');
        EXCEPTION WHEN others THEN
            RAISE EXCEPTION 'cursor: not a cursor this API returned' USING ERRCODE = '22023';
        END;
    END IF;
    -- delivered_json's members, written out in the query rather than called for each item (a
    -- call and its query of the template were a quarter of a page of ten: docs/performance.md,
    -- "0.12.0"); pg_tests/delivery.rs holds a page's item equal to delivery_item's.
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'slug', i.slug, 'template', t.name, 'template_version', t.version,
               'revision_id', r.id, 'revision_number', r.revision_number,
               'fields', r.fields, 'published_at', i.published_at,
               'etag', '"' || left(encode(pg_catalog.sha256(pg_catalog.convert_to(
                           r.id::text || '@' || extract(epoch FROM i.published_at)::text, 'UTF8')), 'hex'), 32) || '"',
               'last_modified', i.published_at) ORDER BY i.slug), '[]') INTO v_items
      FROM (SELECT * FROM querylayer.content_items
             WHERE site_id = querylayer.ctx_site_id() AND published_revision_id IS NOT NULL AND archived_at IS NULL
               AND (v_after IS NULL OR slug > v_after)
             ORDER BY slug LIMIT p_limit) i
      JOIN querylayer.content_revisions r ON r.id = i.published_revision_id
      JOIN querylayer.templates t ON t.id = r.template_id;
    RETURN jsonb_build_object(
        'items', v_items,
        'next_cursor', CASE WHEN jsonb_array_length(v_items) = p_limit
                            THEN rtrim(translate(encode(convert_to(v_items->-1->>'slug', 'UTF8'), 'base64'), '+/', '-_'), '=') END,
        'etag', '"' || left(encode(pg_catalog.sha256(pg_catalog.convert_to(
                    coalesce(p_cursor, '') || '|' || p_limit || '|' ||
                    coalesce((SELECT string_agg(x->>'etag', ',') FROM jsonb_array_elements(v_items) x), ''), 'UTF8')), 'hex'), 32) || '"',
        'last_modified', (SELECT max(executed_at) FROM querylayer.proposal_executions
                           WHERE site_id = querylayer.ctx_site_id() AND status = 'applied'));
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.delivery_item, querylayer_api.delivery_items TO querylayer_edge;

-- -------------------------------------------------------------------------------------------
-- Site owners and admins manage delivery tokens; only an owner makes delivery public.

CREATE FUNCTION querylayer_api.console_list_delivery() RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']::text[]);
    RETURN querylayer.delivery_tokens_json();
END
$$;

CREATE FUNCTION querylayer_api.console_create_delivery_token(p_name text, p_expires_at timestamptz) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']::text[]);
    RETURN querylayer.issue_delivery_token(querylayer.ctx_site_id(), p_name, p_expires_at,
                                           'member:' || querylayer.ctx_member_id());
END
$$;

CREATE FUNCTION querylayer_api.console_revoke_delivery_token(p_token_id uuid, p_reason text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']::text[]);
    RETURN querylayer.revoke_credential('querylayer.delivery_tokens'::regclass, p_token_id, p_reason);
END
$$;

CREATE FUNCTION querylayer_api.console_set_delivery_public(p_public boolean) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner']::text[]);
    RETURN querylayer.set_delivery_public(querylayer.ctx_site_id(), p_public, 'member:' || querylayer.ctx_member_id());
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.console_list_delivery, querylayer_api.console_create_delivery_token,
    querylayer_api.console_revoke_delivery_token, querylayer_api.console_set_delivery_public TO querylayer_edge;

-- Operators.

CREATE FUNCTION querylayer_api.create_delivery_token(p_site text, p_name text, p_expires_at timestamptz) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    RETURN querylayer.issue_delivery_token(v_site.id, p_name, p_expires_at, 'operator:' || querylayer.outer_user());
END
$$;

CREATE FUNCTION querylayer_api.revoke_delivery_token(p_token_id uuid, p_reason text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    PERFORM querylayer.enter_operator(querylayer.site_of_credential('querylayer.delivery_tokens'::regclass, p_token_id));
    RETURN querylayer.revoke_credential('querylayer.delivery_tokens'::regclass, p_token_id, p_reason);
END
$$;

CREATE FUNCTION querylayer_api.set_delivery_public(p_site text, p_public boolean) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    RETURN querylayer.set_delivery_public(v_site.id, p_public, 'operator:' || querylayer.outer_user());
END
$$;
