-- Content: templates, items and their immutable revisions. content_revisions is the only place
-- content bodies live. An item keeps two pointers: the draft (moved by every new revision) and
-- the live one, published_revision_id, which only an executed publish approval moves (see
-- 080_proposals.sql and extension/src/lifecycle.rs). archived_at is guarded the same way.

-- Templates are versioned and immutable: a revision always names the exact version it satisfied.
CREATE TABLE querylayer.templates (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id    uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    name       text NOT NULL CHECK (name ~ '^[a-z][a-z0-9_-]{0,62}$'),
    version    integer NOT NULL CHECK (version > 0),
    fields     jsonb NOT NULL CHECK (jsonb_typeof(fields) = 'array'),
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (site_id, name, version)
);
SELECT querylayer.isolate_by_site('querylayer.templates'::regclass);
SELECT querylayer.make_append_only('querylayer.templates'::regclass);

-- Validates a template's field list: [{"name", "type", "required", "max_length"?}].
CREATE FUNCTION querylayer.check_template_fields(p_fields jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    f jsonb;
    v_names text[] := '{}';
BEGIN
    IF p_fields IS NULL OR jsonb_typeof(p_fields) <> 'array' OR jsonb_array_length(p_fields) = 0 THEN
        RAISE EXCEPTION 'fields must be a non-empty array of {"name", "type", "required"}' USING ERRCODE = '22023';
    END IF;
    FOR f IN SELECT * FROM jsonb_array_elements(p_fields) LOOP
        IF jsonb_typeof(f->'name') IS DISTINCT FROM 'string' OR (f->>'name') !~ '^[a-z][a-z0-9_]{0,62}$' THEN
            RAISE EXCEPTION 'fields: each field needs a "name" of lowercase letters, digits and _; got %', left(f::text, 200)
                USING ERRCODE = '22023';
        END IF;
        IF (f->>'name') = ANY (v_names) THEN
            RAISE EXCEPTION 'fields: % is declared twice', f->>'name' USING ERRCODE = '22023';
        END IF;
        v_names := v_names || (f->>'name');
        IF coalesce(f->>'type', '') NOT IN ('text', 'markdown', 'url', 'list') THEN
            RAISE EXCEPTION 'fields.%.type must be text, markdown, url or list', f->>'name' USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(f->'required') IS DISTINCT FROM 'boolean' THEN
            RAISE EXCEPTION 'fields.%.required must be true or false', f->>'name' USING ERRCODE = '22023';
        END IF;
        IF f ? 'max_length' AND (CASE WHEN jsonb_typeof(f->'max_length') <> 'number' THEN true
                                      ELSE (f->>'max_length')::numeric NOT BETWEEN 1 AND 2147483647
                                        OR (f->>'max_length')::numeric <> trunc((f->>'max_length')::numeric) END) THEN
            RAISE EXCEPTION 'fields.%.max_length must be a whole number from 1 to 2147483647; got %',
                f->>'name', f->'max_length' USING ERRCODE = '22023';
        END IF;
    END LOOP;
    RETURN p_fields;
END
$$;

-- Every problem of a draft's fields against a template's, in one statement: the missing required
-- fields, the unknown fields, then each declared field's first problem (type, URL, list, length),
-- in the template's order. Empty when there is none. max_length is compared as a number: a
-- template made before 0.9.0 may hold a fractional one (2.5 allows two characters).
CREATE FUNCTION querylayer.draft_field_problems(p_template_fields jsonb, p_fields jsonb) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN (
        SELECT array_remove(ARRAY[
                   (SELECT 'missing required fields: ' || string_agg(f->>'name', ', ' ORDER BY f->>'name')
                      FROM jsonb_array_elements(p_template_fields) f
                     WHERE (f->>'required')::boolean
                       AND (NOT p_fields ? (f->>'name')
                            OR p_fields->(f->>'name') IN ('null'::jsonb, '""'::jsonb, '[]'::jsonb))),
                   (SELECT 'unknown fields: ' || string_agg(k, ', ' ORDER BY k)
                      FROM jsonb_object_keys(p_fields) k
                     WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(p_template_fields) f WHERE f->>'name' = k))
               ], NULL)
               || coalesce((
                   SELECT array_agg(x.problem ORDER BY x.o)
                     FROM (SELECT e.o, CASE
                               WHEN e.f->>'type' IN ('text', 'markdown', 'url') AND jsonb_typeof(e.v) <> 'string' THEN
                                   format('%s must be a string', e.f->>'name')
                               WHEN e.f->>'type' = 'url' AND (e.v#>>'{}') !~ '^https?://[^[:space:]]+$' THEN
                                   format('%s must be an http(s) URL', e.f->>'name')
                               WHEN e.f->>'type' = 'list' AND (jsonb_typeof(e.v) <> 'array'
                                     OR EXISTS (SELECT 1 FROM jsonb_array_elements(e.v) el WHERE jsonb_typeof(el) <> 'string')) THEN
                                   format('%s must be a list of strings', e.f->>'name')
                               WHEN e.f ? 'max_length' AND jsonb_typeof(e.v) = 'string'
                                    AND length(e.v#>>'{}') > (e.f->>'max_length')::numeric THEN
                                   format('%s is longer than %s characters', e.f->>'name', e.f->>'max_length')
                           END AS problem
                             FROM (SELECT d.f, d.o, p_fields->(d.f->>'name') AS v
                                     FROM jsonb_array_elements(p_template_fields) WITH ORDINALITY AS d(f, o)) e
                            WHERE e.v IS NOT NULL AND e.v <> 'null'::jsonb) x
                    WHERE x.problem IS NOT NULL), '{}')
    );
END
$$;

-- The one template contract for agent and member drafts: names every missing, unknown or
-- ill-typed field in one message. A draft the extension vouches for (extension/src/drafts.rs)
-- has no problem to name, so the statement runs only for the others.
CREATE FUNCTION querylayer.check_draft_fields(p_template querylayer.templates, p_fields jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_problems text[];
BEGIN
    IF p_fields IS NULL OR jsonb_typeof(p_fields) <> 'object' THEN
        RAISE EXCEPTION 'fields must be a JSON object keyed by the template''s field names' USING ERRCODE = '22023';
    END IF;
    IF querylayer.draft_fields_fit(p_template.fields, p_fields) THEN
        RETURN p_fields;
    END IF;
    v_problems := querylayer.draft_field_problems(p_template.fields, p_fields);
    IF cardinality(v_problems) > 0 THEN
        RAISE EXCEPTION 'the draft does not satisfy template % (version %): %', p_template.name, p_template.version,
            array_to_string(v_problems, '; ')
            USING ERRCODE = 'QL422',
                  HINT = (SELECT 'template fields: ' || string_agg(format('%s (%s%s)', f->>'name', f->>'type',
                              CASE WHEN (f->>'required')::boolean THEN ', required' ELSE '' END), ', ')
                            FROM jsonb_array_elements(p_template.fields) f);
    END IF;
    RETURN p_fields;
END
$$;

CREATE TABLE querylayer.content_items (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id               uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    slug                  text NOT NULL CHECK (length(slug) <= 200 AND slug ~ '^[a-z0-9][a-z0-9/_-]*$'),
    template_name         text NOT NULL,
    draft_revision_id     uuid,
    published_revision_id uuid,
    published_at          timestamptz,
    archived_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    UNIQUE (site_id, slug)
);
SELECT querylayer.isolate_by_site('querylayer.content_items'::regclass);
-- list_content's order: a page is read from the index, whatever the site's size.
CREATE INDEX content_items_site_created ON querylayer.content_items (site_id, created_at DESC, id DESC);

-- An agent's record belongs to an open run of its own connection; a member's to that member.
-- Held by the tables (revisions, proposals, source packages, evidence), so no code path can
-- attribute work loosely.
CREATE FUNCTION querylayer.check_authorship() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_run querylayer.runs;
BEGIN
    IF querylayer.restoring() THEN
        RETURN NEW;  -- a restore brings the row as it was dumped
    END IF;
    IF NEW.author_kind = 'agent' THEN
        -- Shares the run's lock with its other records; a finish waits for this transaction.
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(pg_catalog.hashtextextended(NEW.run_id::text, 7));
        SELECT * INTO v_run FROM querylayer.runs WHERE id = NEW.run_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'no run % on this site', NEW.run_id USING ERRCODE = 'QL404';
        END IF;
        IF v_run.connection_id <> NEW.connection_id OR v_run.agent_id <> NEW.agent_id
           OR v_run.site_id <> NEW.site_id THEN
            RAISE EXCEPTION 'agent work must belong to an open run of the same connection' USING ERRCODE = 'QL403',
                HINT = 'begin a run with this connection and pass its run_id';
        END IF;
        IF EXISTS (SELECT 1 FROM querylayer.run_events WHERE run_id = NEW.run_id AND kind = 'finished') THEN
            RAISE EXCEPTION 'run % is finished; it accepts nothing more', NEW.run_id USING ERRCODE = 'QL410',
                HINT = 'begin a new run';
        END IF;
        IF querylayer.ctx_kind() = 'connection' AND NEW.connection_id IS DISTINCT FROM querylayer.ctx_connection_id() THEN
            RAISE EXCEPTION 'agent work is attributed to the connection acting now' USING ERRCODE = 'QL403';
        END IF;
    ELSIF querylayer.ctx_kind() = 'member' AND NEW.member_id IS DISTINCT FROM querylayer.ctx_member_id() THEN
        RAISE EXCEPTION 'member work is attributed to the member acting now' USING ERRCODE = 'QL403';
    END IF;
    RETURN NEW;
END
$$;

-- Gives a table the attribution of agent and member work: who wrote it (an agent through a
-- connection inside a run, or a member), checked on every insert by check_authorship.
CREATE FUNCTION querylayer.make_attributed(p_table regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s
        ADD COLUMN author_kind text NOT NULL DEFAULT ''agent'' CHECK (author_kind IN (''agent'', ''member'')),
        ADD COLUMN agent_id uuid REFERENCES querylayer.agents ON DELETE RESTRICT,
        ADD COLUMN connection_id uuid REFERENCES querylayer.connections ON DELETE RESTRICT,
        ADD COLUMN run_id uuid REFERENCES querylayer.runs ON DELETE RESTRICT,
        ADD COLUMN member_id uuid REFERENCES querylayer.members ON DELETE RESTRICT,
        ADD CHECK (CASE author_kind
            WHEN ''agent'' THEN agent_id IS NOT NULL AND connection_id IS NOT NULL AND run_id IS NOT NULL AND member_id IS NULL
            ELSE member_id IS NOT NULL AND agent_id IS NULL AND connection_id IS NULL AND run_id IS NULL END)', p_table);
    EXECUTE format('CREATE TRIGGER aa_check_authorship BEFORE INSERT ON %s
                    FOR EACH ROW EXECUTE FUNCTION querylayer.check_authorship()', p_table);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER aa_check_authorship', p_table);
END
$$;

CREATE TABLE querylayer.content_revisions (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    content_id      uuid NOT NULL REFERENCES querylayer.content_items ON DELETE RESTRICT,
    revision_number integer NOT NULL CHECK (revision_number > 0),
    template_id     uuid NOT NULL REFERENCES querylayer.templates ON DELETE RESTRICT,
    fields          jsonb NOT NULL CHECK (jsonb_typeof(fields) = 'object'),
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (content_id, revision_number),
    UNIQUE (content_id, id)
);
SELECT querylayer.isolate_by_site('querylayer.content_revisions'::regclass);
SELECT querylayer.make_attributed('querylayer.content_revisions'::regclass);
SELECT querylayer.make_chained('querylayer.content_revisions'::regclass);

-- The pointers name revisions of the same item.
ALTER TABLE querylayer.content_items
    ADD FOREIGN KEY (id, draft_revision_id) REFERENCES querylayer.content_revisions (content_id, id) ON DELETE RESTRICT,
    ADD FOREIGN KEY (id, published_revision_id) REFERENCES querylayer.content_revisions (content_id, id) ON DELETE RESTRICT;


-- The live pointer, its timestamp and archived_at move only under the lifecycle mark, which
-- only the extension's execution of an approved decision sets. Items are never deleted, their
-- identity never changes, and the draft pointer only moves forward.
CREATE FUNCTION querylayer.content_items_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'content items are never deleted; archive them through a content_lifecycle proposal'
            USING ERRCODE = 'QL423';
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF querylayer.restoring() THEN
            RETURN NEW;
        END IF;
        IF NEW.published_revision_id IS NOT NULL OR NEW.published_at IS NOT NULL OR NEW.archived_at IS NOT NULL
           OR NEW.draft_revision_id IS NOT NULL THEN
            RAISE EXCEPTION 'a new content item starts unpublished, unarchived and without revisions'
                USING ERRCODE = 'QL423';
        END IF;
        RETURN NEW;
    END IF;
    IF (NEW.published_revision_id, NEW.published_at, NEW.archived_at)
       IS DISTINCT FROM (OLD.published_revision_id, OLD.published_at, OLD.archived_at)
       AND querylayer.lifecycle_mark() IS NULL THEN
        RAISE EXCEPTION 'published_revision_id and archived_at change only when an approved lifecycle proposal executes'
            USING ERRCODE = 'QL423',
                  HINT = 'request publishing with querylayer_api.request_publish_approval; a member decides';
    END IF;
    IF (NEW.id, NEW.site_id, NEW.slug, NEW.template_name, NEW.created_at)
       IS DISTINCT FROM (OLD.id, OLD.site_id, OLD.slug, OLD.template_name, OLD.created_at) THEN
        RAISE EXCEPTION 'a content item''s identity is immutable' USING ERRCODE = 'QL423';
    END IF;
    IF NEW.draft_revision_id IS DISTINCT FROM OLD.draft_revision_id
       AND (NEW.draft_revision_id IS NULL
            OR (SELECT revision_number FROM querylayer.content_revisions WHERE id = NEW.draft_revision_id)
               <= coalesce((SELECT revision_number FROM querylayer.content_revisions WHERE id = OLD.draft_revision_id), 0)) THEN
        RAISE EXCEPTION 'the draft pointer only moves to a newer revision' USING ERRCODE = 'QL423';
    END IF;
    RETURN NEW;
END
$$;
SELECT querylayer.guard_rows('querylayer.content_items'::regclass, 'querylayer.content_items_guard'::regproc, true);

CREATE FUNCTION querylayer.content_state(p_item querylayer.content_items) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN CASE WHEN p_item.archived_at IS NOT NULL THEN 'archived'
                WHEN p_item.published_revision_id IS NOT NULL THEN 'published'
                ELSE 'draft' END;
END
$$;

-- An item as readers see it, given its draft revision's title and number: the shape of a single
-- item (content_json, create_draft's answer); a page of a list writes the same members in its
-- query (content_json_list).
CREATE FUNCTION querylayer.content_json_of(p_item querylayer.content_items, p_title text, p_draft_number integer)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN jsonb_build_object(
        'content_id', p_item.id, 'slug', p_item.slug, 'template', p_item.template_name,
        'title', p_title, 'state', querylayer.content_state(p_item),
        'draft_revision_id', p_item.draft_revision_id, 'draft_revision_number', p_draft_number,
        'published_revision_id', p_item.published_revision_id, 'published_at', p_item.published_at,
        'archived_at', p_item.archived_at,
        'has_unpublished_changes', p_item.draft_revision_id IS DISTINCT FROM p_item.published_revision_id,
        'updated_at', p_item.updated_at);
END
$$;

CREATE FUNCTION querylayer.content_json(p_item querylayer.content_items) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT querylayer.content_json_of(p_item, d.fields->>'title', d.revision_number)
              FROM (SELECT 1) one
              LEFT JOIN querylayer.content_revisions d ON d.id = p_item.draft_revision_id);
END
$$;

-- The items p_ids in that order, as a JSON array: a page of a list in one query, not one an item.
-- It writes content_json_of's shape and content_state's rule out in the query rather than calling
-- them for each item: a call of a PL/pgSQL function costs 12,000 to 19,000 instructions (its pinned
-- search_path saved and restored, its frame), and two calls an item were an eighth of a page of
-- ten (docs/performance.md, "0.12.0"). pg_tests/reading.rs holds every member of every item of a
-- page, in each state, equal to what content_json gives for it.
CREATE FUNCTION querylayer.content_json_list(p_ids uuid[]) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'content_id', i.id, 'slug', i.slug, 'template', i.template_name,
               'title', d.fields->>'title',
               'state', CASE WHEN i.archived_at IS NOT NULL THEN 'archived'
                             WHEN i.published_revision_id IS NOT NULL THEN 'published'
                             ELSE 'draft' END,
               'draft_revision_id', i.draft_revision_id, 'draft_revision_number', d.revision_number,
               'published_revision_id', i.published_revision_id, 'published_at', i.published_at,
               'archived_at', i.archived_at,
               'has_unpublished_changes', i.draft_revision_id IS DISTINCT FROM i.published_revision_id,
               'updated_at', i.updated_at) ORDER BY x.o), '[]')
      FROM unnest(p_ids) WITH ORDINALITY AS x(id, o)
      JOIN querylayer.content_items i ON i.id = x.id
      LEFT JOIN querylayer.content_revisions d ON d.id = i.draft_revision_id);
END
$$;

-- The names of the site's templates (newest versions), for site_context and for refusals
-- that must say which exist.
CREATE FUNCTION querylayer.template_names(p_site_id uuid) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN ARRAY(SELECT DISTINCT name FROM querylayer.templates WHERE site_id = p_site_id ORDER BY name);
END
$$;

CREATE FUNCTION querylayer.newest_template(p_site_id uuid, p_name text) RETURNS querylayer.templates
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v       querylayer.templates;
    v_names text[];
BEGIN
    IF p_name IS NOT NULL THEN
        SELECT * INTO v FROM querylayer.templates WHERE site_id = p_site_id AND name = p_name ORDER BY version DESC LIMIT 1;
        IF FOUND THEN
            RETURN v;
        END IF;
    END IF;
    -- Refusals name the templates that exist (read only on this path).
    v_names := querylayer.template_names(p_site_id);
    IF cardinality(v_names) = 0 THEN
        RAISE EXCEPTION 'template: this site has no templates yet, so no draft can be written'
            USING ERRCODE = 'QL422',
                  HINT = 'an operator defines one with querylayer_api.create_template(site, name, fields)';
    END IF;
    IF p_name IS NULL THEN
        RAISE EXCEPTION 'template is required for a new item (one of: %)', array_to_string(v_names, ', ')
            USING ERRCODE = '22023', HINT = 'querylayer_list_templates shows each template''s fields';
    END IF;
    RAISE EXCEPTION 'template: no template named % on this site (one of: %)', quote_literal(p_name),
        array_to_string(v_names, ', ') USING ERRCODE = 'QL404',
        HINT = 'querylayer_list_templates shows each template''s fields';
END
$$;

-- A revision with its fields, template version and author (agent, connection and run, or
-- member), as agents (content:read) and members read it.
CREATE FUNCTION querylayer.revision_json(p_revision_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT jsonb_build_object(
        'revision_id', v.id, 'content_id', v.content_id, 'slug', i.slug, 'revision_number', v.revision_number,
        'template', t.name, 'template_version', t.version, 'fields', v.fields,
        'author', jsonb_build_object('kind', v.author_kind, 'agent_id', v.agent_id, 'agent', a.handle,
                                     'connection_id', v.connection_id, 'run_id', v.run_id, 'run_type', r.run_type,
                                     'member_id', v.member_id, 'member', m.handle),
        'created_at', v.created_at, 'is_draft', v.id = i.draft_revision_id,
        'is_live', v.id IS NOT DISTINCT FROM i.published_revision_id,
        'record_sha256', encode(v.record_sha256, 'hex'),
        'previous_revision_id', (SELECT p.id FROM querylayer.content_revisions p
                                  WHERE p.content_id = v.content_id AND p.revision_number = v.revision_number - 1))
      FROM querylayer.content_revisions v
      JOIN querylayer.templates t ON t.id = v.template_id
      JOIN querylayer.content_items i ON i.id = v.content_id
      LEFT JOIN querylayer.agents a ON a.id = v.agent_id
      LEFT JOIN querylayer.runs r ON r.id = v.run_id
      LEFT JOIN querylayer.members m ON m.id = v.member_id
     WHERE v.id = p_revision_id);
END
$$;

-- -------------------------------------------------------------------------------------------
-- The callable surface.

-- Creates a draft revision (a new item when p_content_id is NULL). Agents draft inside an open
-- run of their connection; members (owner, admin, editor) draft without a run. Never publishes.
CREATE FUNCTION querylayer_api.create_draft(
    p_run_id uuid, p_template text, p_fields jsonb, p_content_id uuid DEFAULT NULL, p_slug text DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_member   boolean := querylayer.ctx_kind() = 'member';
    v_template querylayer.templates;
    v_item     querylayer.content_items;
    v_rev      querylayer.content_revisions;
BEGIN
    IF v_member THEN
        PERFORM querylayer.require_member(ARRAY['owner', 'admin', 'editor']);
        IF p_run_id IS NOT NULL THEN
            RAISE EXCEPTION 'run_id: members draft outside governed runs; omit it' USING ERRCODE = '22023';
        END IF;
    ELSE
        PERFORM querylayer.require_connection('content:write'::text);
        IF p_run_id IS NULL THEN
            RAISE EXCEPTION 'run_id is required: an agent draft belongs to an open run of its connection'
                USING ERRCODE = '22023', HINT = 'call begin_run first';
        END IF;
    END IF;
    IF p_content_id IS NULL THEN
        IF p_slug IS NULL OR length(p_slug) > 200 OR p_slug !~ '^[a-z0-9][a-z0-9/_-]*$' THEN
            RAISE EXCEPTION 'slug is required for a new item (lowercase letters, digits and /_-, at most 200); got %',
                coalesce(quote_literal(p_slug), 'NULL') USING ERRCODE = '22023';
        END IF;
        v_template := querylayer.newest_template(querylayer.ctx_site_id(), p_template);
        PERFORM querylayer.check_draft_fields(v_template, p_fields);
        -- Two drafts racing for one new slug: one item, and the other caller is told so.
        INSERT INTO querylayer.content_items (site_id, slug, template_name)
        VALUES (querylayer.ctx_site_id(), p_slug, v_template.name)
        ON CONFLICT (site_id, slug) DO NOTHING
        RETURNING * INTO v_item;
        IF v_item.id IS NULL THEN
            RAISE EXCEPTION 'an item with slug % already exists on this site', quote_literal(p_slug) USING ERRCODE = 'QL409',
                HINT = 'pass its content_id to add a revision';
        END IF;
    ELSE
        SELECT * INTO v_item FROM querylayer.content_items WHERE id = p_content_id FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'no content item % on this site', p_content_id USING ERRCODE = 'QL404';
        END IF;
        IF v_item.archived_at IS NOT NULL THEN
            RAISE EXCEPTION 'content item % is archived; restore it before drafting', p_content_id USING ERRCODE = 'QL422';
        END IF;
        IF p_template IS NOT NULL AND p_template <> v_item.template_name THEN
            RAISE EXCEPTION 'content item % uses template %, not %', p_content_id, v_item.template_name, p_template
                USING ERRCODE = '22023';
        END IF;
        IF p_slug IS NOT NULL AND p_slug <> v_item.slug THEN
            RAISE EXCEPTION 'slug: an item''s slug cannot change (it is %)', v_item.slug USING ERRCODE = '22023';
        END IF;
        v_template := querylayer.newest_template(v_item.site_id, v_item.template_name);
        PERFORM querylayer.check_draft_fields(v_template, p_fields);
    END IF;
    INSERT INTO querylayer.content_revisions (site_id, content_id, revision_number, template_id, fields, author_kind,
                                              agent_id, connection_id, run_id, member_id)
    VALUES (v_item.site_id, v_item.id,
            coalesce((SELECT max(revision_number) FROM querylayer.content_revisions WHERE content_id = v_item.id), 0) + 1,
            v_template.id, p_fields,
            CASE WHEN v_member THEN 'member' ELSE 'agent' END,
            CASE WHEN v_member THEN NULL ELSE querylayer.ctx_agent_id() END,
            CASE WHEN v_member THEN NULL ELSE querylayer.ctx_connection_id() END,
            CASE WHEN v_member THEN NULL ELSE p_run_id END,
            CASE WHEN v_member THEN querylayer.ctx_member_id() END)
    RETURNING * INTO v_rev;
    UPDATE querylayer.content_items SET draft_revision_id = v_rev.id, updated_at = now()
     WHERE id = v_item.id RETURNING * INTO v_item;
    PERFORM querylayer.audit('content.draft'::text, v_item.id::text,
        jsonb_build_object('revision_id', v_rev.id, 'revision_number', v_rev.revision_number, 'run_id', p_run_id));
    -- The answer from what this transaction holds: the item's draft is the revision just written
    -- (what content_json would read back).
    RETURN querylayer.content_json_of(v_item, v_rev.fields->>'title', v_rev.revision_number)
           || jsonb_build_object('revision_id', v_rev.id, 'revision_number', v_rev.revision_number);
END
$$;

-- Newest items first (by creation, which never changes, so pages stay stable while items are
-- drafted or published); a page of p_limit and the cursor of the next.
CREATE FUNCTION querylayer_api.list_content(p_state text DEFAULT NULL, p_limit integer DEFAULT 50, p_cursor text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
    v_ids   uuid[];
    v_keys  timestamptz[];
BEGIN
    PERFORM querylayer.require_principal('content:read'::text);
    IF p_state IS NOT NULL AND p_state NOT IN ('draft', 'published', 'archived') THEN
        RAISE EXCEPTION 'state must be draft, published or archived; got %', quote_literal(p_state) USING ERRCODE = '22023';
    END IF;
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('content'::text, p_cursor);
    SELECT array_agg(c.id ORDER BY c.created_at DESC, c.id DESC), array_agg(c.created_at ORDER BY c.created_at DESC, c.id DESC)
      INTO v_ids, v_keys
      FROM (SELECT c.id, c.created_at FROM querylayer.content_items c
             WHERE c.site_id = querylayer.ctx_site_id()
               -- content_state's rule, written here: a call an item passed cost more than the
               -- rest of the filter (pg_tests/reading.rs holds the two equal).
               AND (p_state IS NULL
                    OR p_state = CASE WHEN c.archived_at IS NOT NULL THEN 'archived'
                                      WHEN c.published_revision_id IS NOT NULL THEN 'published' ELSE 'draft' END)
               AND (v_after.after_id IS NULL
                    OR (c.created_at, c.id) < (v_after.after_key::timestamptz, v_after.after_id))
             ORDER BY c.created_at DESC, c.id DESC LIMIT p_limit + 1) c;
    RETURN jsonb_build_object('items', querylayer.content_json_list(v_ids[1:p_limit]),
                              'next_cursor', querylayer.next_cursor('content'::text, p_limit, coalesce(cardinality(v_ids), 0),
                                                                    querylayer.page_key(v_keys[p_limit]), v_ids[p_limit]));
END
$$;

CREATE FUNCTION querylayer_api.get_revision(p_revision_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v jsonb;
BEGIN
    PERFORM querylayer.require_principal('content:read'::text);
    v := querylayer.revision_json(p_revision_id);
    IF v IS NULL THEN
        RAISE EXCEPTION 'revision_id: no revision % on this site', p_revision_id USING ERRCODE = 'QL404';
    END IF;
    RETURN v;
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.create_draft, querylayer_api.list_content, querylayer_api.get_revision
    TO querylayer_edge;

-- Operators define templates; a new definition of an existing name is a new version.
CREATE FUNCTION querylayer_api.create_template(p_site text, p_name text, p_fields jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
    v      querylayer.templates;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    IF p_name IS NULL OR p_name !~ '^[a-z][a-z0-9_-]{0,62}$' THEN
        RAISE EXCEPTION 'invalid template name %', coalesce(quote_literal(p_name), 'NULL') USING ERRCODE = '22023';
    END IF;
    INSERT INTO querylayer.templates (site_id, name, version, fields)
    VALUES (v_site.id, p_name,
            coalesce((SELECT max(version) FROM querylayer.templates WHERE site_id = v_site.id AND name = p_name), 0) + 1,
            querylayer.check_template_fields(p_fields))
    RETURNING * INTO v;
    PERFORM querylayer.audit('template.create'::text, v.id::text, jsonb_build_object('name', v.name, 'version', v.version));
    RETURN jsonb_build_object('template_id', v.id, 'site', v_site.slug, 'name', v.name, 'version', v.version, 'fields', v.fields);
END
$$;
