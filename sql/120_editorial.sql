-- Editorial planning: the topical map, imported topical strategy opportunities, and content
-- briefs. Agents read the map and the opportunity queue and propose (typed topical_map
-- proposals); they never change the map. A member's approval executes the changes under the
-- approval mark, and an approval of page-oriented work commissions exactly one immutable brief.

CREATE TABLE querylayer.topics (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id     uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    slug        text NOT NULL CHECK (slug ~ '^[a-z0-9][a-z0-9-]{0,99}$'),
    title       text NOT NULL CHECK (length(title) BETWEEN 1 AND 300),
    parent_id   uuid REFERENCES querylayer.topics ON DELETE RESTRICT,
    decision_id uuid REFERENCES querylayer.proposal_decisions ON DELETE RESTRICT,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (site_id, slug)
);
SELECT querylayer.isolate_by_site('querylayer.topics'::regclass);

CREATE TABLE querylayer.topic_pages (
    site_id     uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    topic_id    uuid NOT NULL REFERENCES querylayer.topics ON DELETE RESTRICT,
    content_id  uuid NOT NULL REFERENCES querylayer.content_items ON DELETE RESTRICT,
    role        text NOT NULL CHECK (role IN ('pillar', 'supporting')),
    decision_id uuid REFERENCES querylayer.proposal_decisions ON DELETE RESTRICT,
    added_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic_id, content_id)
);
SELECT querylayer.isolate_by_site('querylayer.topic_pages'::regclass);

-- The map changes when a member's approved topical_map decision executes (under the approval
-- mark). The one other change is an operator seeding the map: an operator context may add a
-- topic (querylayer_api.add_topic, audited as topic.add with the operator's role, and the topic
-- carries no decision_id), and nothing else: no page attachment, no brief, no edit or removal.
-- Operators administer the site (they appoint its members), so an approval they could grant
-- themselves would prove nothing; what binds is that agents never change the map (seed 000).
CREATE FUNCTION querylayer.topical_map_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' AND querylayer.restoring() THEN
        RETURN NEW;
    END IF;
    IF querylayer.lifecycle_mark() IS NOT NULL THEN
        RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF querylayer.ctx_is_operator() AND TG_OP = 'INSERT' AND TG_TABLE_NAME = 'topics' THEN
        IF NEW.decision_id IS NOT NULL THEN
            RAISE EXCEPTION 'an operator''s topic is not a decision''s' USING ERRCODE = 'QL423';
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'the topical map changes only through an approved topical_map proposal'
        USING ERRCODE = 'QL423', HINT = 'propose the change; a member decides (operators may only add topics)';
END
$$;
CREATE TRIGGER topical_map_guard BEFORE INSERT OR UPDATE OR DELETE ON querylayer.topics
    FOR EACH ROW EXECUTE FUNCTION querylayer.topical_map_guard();
ALTER TABLE querylayer.topics ENABLE ALWAYS TRIGGER topical_map_guard;
CREATE TRIGGER topical_map_guard BEFORE INSERT OR UPDATE OR DELETE ON querylayer.topic_pages
    FOR EACH ROW EXECUTE FUNCTION querylayer.topical_map_guard();
ALTER TABLE querylayer.topic_pages ENABLE ALWAYS TRIGGER topical_map_guard;
CREATE TRIGGER topics_no_truncate BEFORE TRUNCATE ON querylayer.topics
    FOR EACH STATEMENT EXECUTE FUNCTION querylayer.forbid_change();
ALTER TABLE querylayer.topics ENABLE ALWAYS TRIGGER topics_no_truncate;
CREATE TRIGGER topic_pages_no_truncate BEFORE TRUNCATE ON querylayer.topic_pages
    FOR EACH STATEMENT EXECUTE FUNCTION querylayer.forbid_change();
ALTER TABLE querylayer.topic_pages ENABLE ALWAYS TRIGGER topic_pages_no_truncate;

-- Imported strategy: planning inputs with provenance. Their `signals` are the source's own
-- estimates and are never presented as measured search performance.
CREATE TABLE querylayer.strategy_import_batches (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id      uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    source       text NOT NULL CHECK (length(source) BETWEEN 1 AND 200),
    imported_at  timestamptz NOT NULL DEFAULT now(),
    imported_by  text NOT NULL,
    record_count integer NOT NULL
);
SELECT querylayer.isolate_by_site('querylayer.strategy_import_batches'::regclass);
SELECT querylayer.make_append_only('querylayer.strategy_import_batches'::regclass);

CREATE TABLE querylayer.strategy_opportunities (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id     uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    batch_id    uuid NOT NULL REFERENCES querylayer.strategy_import_batches ON DELETE RESTRICT,
    external_id text NOT NULL CHECK (length(external_id) BETWEEN 1 AND 200),
    topic_slug  text NOT NULL CHECK (topic_slug ~ '^[a-z0-9][a-z0-9-]{0,99}$'),
    title       text NOT NULL CHECK (length(title) BETWEEN 1 AND 300),
    rationale   text,
    signals     jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(signals) = 'object'),
    UNIQUE (batch_id, external_id)
);
SELECT querylayer.isolate_by_site('querylayer.strategy_opportunities'::regclass);
SELECT querylayer.make_append_only('querylayer.strategy_opportunities'::regclass);

CREATE TABLE querylayer.content_briefs (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    proposal_id    uuid NOT NULL UNIQUE REFERENCES querylayer.proposals ON DELETE RESTRICT,
    decision_id    uuid NOT NULL UNIQUE REFERENCES querylayer.proposal_decisions ON DELETE RESTRICT,
    topic_slug     text NOT NULL,
    title          text NOT NULL,
    brief          jsonb NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
SELECT querylayer.isolate_by_site('querylayer.content_briefs'::regclass);
SELECT querylayer.make_chained('querylayer.content_briefs'::regclass);
CREATE TRIGGER aa_briefs_only_by_approval BEFORE INSERT ON querylayer.content_briefs
    FOR EACH ROW EXECUTE FUNCTION querylayer.topical_map_guard();
ALTER TABLE querylayer.content_briefs ENABLE ALWAYS TRIGGER aa_briefs_only_by_approval;

-- -------------------------------------------------------------------------------------------
-- topical_map proposals: payload {changes: [...]} with
--   {"op": "add_topic", "slug", "title", "parent"?}
--   {"op": "attach_page", "topic", "content_id", "role": "pillar" | "supporting"}
--   {"op": "plan_page", "topic", "title", "opportunity_id"?}   (page-oriented: commissions a brief)

CREATE FUNCTION querylayer.check_topical_changes(p_payload jsonb) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    c      jsonb;
    n      integer := 0;
    v_path text;
BEGIN
    IF jsonb_typeof(p_payload->'changes') IS DISTINCT FROM 'array' OR jsonb_array_length(p_payload->'changes') NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'payload.changes: an array of 1 to 200 changes is required' USING ERRCODE = '22023';
    END IF;
    FOR c IN SELECT * FROM jsonb_array_elements(p_payload->'changes') LOOP
        v_path := format('payload.changes[%s]', n);
        n := n + 1;
        IF jsonb_typeof(c) <> 'object' THEN
            RAISE EXCEPTION '%: an object is required', v_path USING ERRCODE = '22023';
        END IF;
        CASE c->>'op'
            WHEN 'add_topic' THEN
                IF (c->>'slug') IS NULL OR (c->>'slug') !~ '^[a-z0-9][a-z0-9-]{0,99}$' THEN
                    RAISE EXCEPTION '%.slug: lowercase letters, digits and dashes are required', v_path USING ERRCODE = '22023';
                END IF;
                IF length(coalesce(c->>'title', '')) NOT BETWEEN 1 AND 300 THEN
                    RAISE EXCEPTION '%.title: 1 to 300 characters are required', v_path USING ERRCODE = '22023';
                END IF;
            WHEN 'attach_page' THEN
                PERFORM querylayer.payload_uuid(c->'content_id', v_path || '.content_id');
                IF NOT EXISTS (SELECT 1 FROM querylayer.content_items WHERE id = (c->>'content_id')::uuid) THEN
                    RAISE EXCEPTION '%.content_id: no content item % on this site', v_path, c->>'content_id' USING ERRCODE = 'QL404';
                END IF;
                IF coalesce(c->>'role', '') NOT IN ('pillar', 'supporting') THEN
                    RAISE EXCEPTION '%.role: pillar or supporting is required', v_path USING ERRCODE = '22023';
                END IF;
                IF (c->>'topic') IS NULL THEN
                    RAISE EXCEPTION '%.topic: a topic slug is required', v_path USING ERRCODE = '22023';
                END IF;
            WHEN 'plan_page' THEN
                IF (c->>'topic') IS NULL THEN
                    RAISE EXCEPTION '%.topic: a topic slug is required', v_path USING ERRCODE = '22023';
                END IF;
                IF length(coalesce(c->>'title', '')) NOT BETWEEN 1 AND 300 THEN
                    RAISE EXCEPTION '%.title: 1 to 300 characters are required', v_path USING ERRCODE = '22023';
                END IF;
                IF c ? 'opportunity_id' AND NOT EXISTS (
                       SELECT 1 FROM querylayer.strategy_opportunities
                        WHERE id = querylayer.payload_uuid(c->'opportunity_id', v_path || '.opportunity_id')) THEN
                    RAISE EXCEPTION '%.opportunity_id: no imported opportunity % on this site', v_path, c->>'opportunity_id'
                        USING ERRCODE = 'QL404';
                END IF;
            ELSE
                RAISE EXCEPTION '%.op must be add_topic, attach_page or plan_page', v_path USING ERRCODE = '22023';
        END CASE;
    END LOOP;
    -- The opportunities a proposal says it reconciles (their state follows its decision, and
    -- its brief cites them) are exactly ones its own plan_page changes plan.
    IF p_payload ? 'opportunity_ids' AND (jsonb_typeof(p_payload->'opportunity_ids') <> 'array' OR EXISTS (
           SELECT 1 FROM jsonb_array_elements(p_payload->'opportunity_ids') AS claimed(id)
            WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(p_payload->'changes') AS planned(change)
                               WHERE planned.change->>'op' = 'plan_page'
                                 AND lower(planned.change->>'opportunity_id') = lower(claimed.id #>> '{}')))) THEN
        RAISE EXCEPTION 'payload.opportunity_ids: each must be the opportunity_id of one of the proposal''s plan_page changes'
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- Executes an approved topical_map proposal: all changes or none, then one brief when the work
-- is page-oriented.
CREATE FUNCTION querylayer.apply_topical_map(p_decision uuid) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_dec      querylayer.proposal_decisions;
    v_prop     querylayer.proposals;
    c          jsonb;
    v_new      text[] := '{}';
    v_problems jsonb := '[]';
    v_pages    jsonb := '[]';
    v_topic    uuid;
    v_status   text := 'applied';
    v_brief    uuid;
BEGIN
    SELECT * INTO STRICT v_dec FROM querylayer.proposal_decisions WHERE id = p_decision;
    SELECT * INTO STRICT v_prop FROM querylayer.proposals WHERE id = v_dec.proposal_id;
    -- Check every change against the map as it is now (and the topics this proposal adds).
    FOR c IN SELECT * FROM jsonb_array_elements(v_prop.payload->'changes') LOOP
        IF c->>'op' = 'add_topic' THEN
            IF EXISTS (SELECT 1 FROM querylayer.topics WHERE site_id = v_prop.site_id AND slug = c->>'slug') OR (c->>'slug') = ANY (v_new) THEN
                v_problems := v_problems || jsonb_build_object('change', c, 'reason', 'topic exists');
            ELSIF c ? 'parent' AND NOT ((c->>'parent') = ANY (v_new)) AND NOT EXISTS (
                    SELECT 1 FROM querylayer.topics WHERE site_id = v_prop.site_id AND slug = c->>'parent') THEN
                v_problems := v_problems || jsonb_build_object('change', c, 'reason', 'unknown parent topic');
            END IF;
            v_new := v_new || (c->>'slug');
        ELSIF NOT ((c->>'topic') = ANY (v_new)) AND NOT EXISTS (
                SELECT 1 FROM querylayer.topics WHERE site_id = v_prop.site_id AND slug = c->>'topic') THEN
            v_problems := v_problems || jsonb_build_object('change', c, 'reason', 'unknown topic');
        END IF;
    END LOOP;
    IF jsonb_array_length(v_problems) > 0 THEN
        v_status := 'failed';
    ELSE
        FOR c IN SELECT * FROM jsonb_array_elements(v_prop.payload->'changes') LOOP
            CASE c->>'op'
                WHEN 'add_topic' THEN
                    INSERT INTO querylayer.topics (site_id, slug, title, parent_id, decision_id)
                    VALUES (v_prop.site_id, c->>'slug', c->>'title',
                            (SELECT id FROM querylayer.topics WHERE site_id = v_prop.site_id AND slug = c->>'parent'), p_decision);
                WHEN 'attach_page' THEN
                    SELECT id INTO v_topic FROM querylayer.topics WHERE site_id = v_prop.site_id AND slug = c->>'topic';
                    INSERT INTO querylayer.topic_pages (site_id, topic_id, content_id, role, decision_id)
                    VALUES (v_prop.site_id, v_topic, (c->>'content_id')::uuid, c->>'role', p_decision)
                    ON CONFLICT (topic_id, content_id) DO NOTHING;
                ELSE
                    v_pages := v_pages || jsonb_build_object('topic', c->>'topic', 'title', c->>'title',
                                                             'opportunity_id', c->'opportunity_id');
            END CASE;
        END LOOP;
        IF jsonb_array_length(v_pages) > 0 THEN
            INSERT INTO querylayer.content_briefs (site_id, proposal_id, decision_id, topic_slug, title, brief)
            VALUES (v_prop.site_id, v_prop.id, p_decision, v_pages->0->>'topic', v_pages->0->>'title',
                    jsonb_build_object('pages', v_pages, 'summary', v_prop.summary, 'note', v_dec.note,
                                       'opportunity_ids', coalesce(v_prop.payload->'opportunity_ids', '[]')))
            RETURNING id INTO v_brief;
        END IF;
    END IF;
    INSERT INTO querylayer.proposal_executions (decision_id, site_id, proposal_id, status, detail)
    VALUES (v_dec.id, v_dec.site_id, v_dec.proposal_id, v_status,
            CASE v_status WHEN 'applied' THEN jsonb_build_object('brief_id', v_brief, 'changes', jsonb_array_length(v_prop.payload->'changes'))
                          ELSE jsonb_build_object('problems', v_problems, 'message', 'nothing was changed') END);
    RETURN jsonb_build_object('status', v_status, 'brief_id', v_brief, 'problems', v_problems);
END
$$;

-- Contributor output may name a brief and staged source records; they must exist on this site.
CREATE FUNCTION querylayer.check_draft_references(p_payload jsonb) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_payload ? 'brief_id' AND NOT EXISTS (
        SELECT 1 FROM querylayer.content_briefs WHERE id = querylayer.payload_uuid(p_payload->'brief_id', 'payload.brief_id'::text)) THEN
        RAISE EXCEPTION 'payload.brief_id: no content brief % on this site', p_payload->>'brief_id' USING ERRCODE = 'QL404';
    END IF;
    IF p_payload ? 'source_record_ids' THEN
        IF jsonb_typeof(p_payload->'source_record_ids') <> 'array' OR EXISTS (
            SELECT 1 FROM jsonb_array_elements(p_payload->'source_record_ids') r
             WHERE NOT EXISTS (SELECT 1 FROM querylayer.content_source_records s
                                WHERE s.id = querylayer.payload_uuid(r, 'payload.source_record_ids[]'::text))) THEN
            RAISE EXCEPTION 'payload.source_record_ids: every id must name a staged record on this site' USING ERRCODE = 'QL404';
        END IF;
    END IF;
END
$$;

-- -------------------------------------------------------------------------------------------
-- The callable surface.

-- Topics by slug; a page of p_limit and the cursor of the next. Each topic carries the pages
-- that serve it.
CREATE FUNCTION querylayer_api.list_topical_map(p_limit integer DEFAULT 100, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.require_principal('topical-map:read'::text);
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('topics'::text, p_cursor);
    RETURN querylayer.page('topics'::text, 'topics'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', t.slug, 'id', t.id, 'item', jsonb_build_object(
                   'topic_id', t.id, 'slug', t.slug, 'title', t.title,
                   'parent', (SELECT p.slug FROM querylayer.topics p WHERE p.id = t.parent_id),
                   'pages', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                                 'content_id', tp.content_id, 'slug', ci.slug, 'role', tp.role,
                                 'state', querylayer.content_state(ci)) ORDER BY tp.role, ci.slug), '[]')
                               FROM querylayer.topic_pages tp JOIN querylayer.content_items ci ON ci.id = tp.content_id
                              WHERE tp.topic_id = t.id))) ORDER BY t.slug, t.id)
          FROM (SELECT * FROM querylayer.topics x
                 WHERE x.site_id = querylayer.ctx_site_id()
                   AND (v_after.after_id IS NULL OR (x.slug, x.id) > (v_after.after_key, v_after.after_id))
                 ORDER BY x.slug, x.id LIMIT p_limit + 1) t));
END
$$;
-- The opportunity queue with provenance and reconciliation state against the map:
-- new (no such topic), matched (the topic exists), proposed (in a pending proposal),
-- accepted or rejected (decided).
CREATE FUNCTION querylayer_api.list_topical_strategy_opportunities(p_state text DEFAULT NULL, p_limit integer DEFAULT 100,
                                                                   p_cursor text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.require_principal('topical-map:read'::text);
    IF p_state IS NOT NULL AND p_state NOT IN ('new', 'matched', 'proposed', 'accepted', 'rejected') THEN
        RAISE EXCEPTION 'state must be new, matched, proposed, accepted or rejected' USING ERRCODE = '22023';
    END IF;
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('opportunities'::text, p_cursor);
    RETURN jsonb_build_object(
        'note', 'Imported planning inputs with provenance. Signals are the source''s own estimates, not measured search performance.')
        || querylayer.page('opportunities'::text, 'opportunities'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('item', q.o, 'key', querylayer.page_key(q.imported_at), 'id', q.id)
                         ORDER BY q.imported_at, q.id) FROM (
            SELECT s.id, b.imported_at, jsonb_build_object(
                'opportunity_id', s.id, 'external_id', s.external_id, 'topic', s.topic_slug, 'title', s.title,
                'rationale', s.rationale, 'planning_signals', s.signals,
                'provenance', jsonb_build_object('source', b.source, 'import_batch_id', b.id, 'imported_at', b.imported_at),
                'imported_at', b.imported_at,
                'reconciliation_state', r.state, 'proposal_id', r.proposal_id) AS o
              FROM querylayer.strategy_opportunities s
              JOIN querylayer.strategy_import_batches b ON b.id = s.batch_id
              CROSS JOIN LATERAL (
                SELECT CASE
                         WHEN pj->>'state' IN ('approved', 'applied') THEN 'accepted'
                         WHEN pj->>'state' IN ('rejected', 'failed') THEN 'rejected'
                         WHEN pj->>'state' = 'pending' THEN 'proposed'
                         WHEN EXISTS (SELECT 1 FROM querylayer.topics t WHERE t.site_id = s.site_id AND t.slug = s.topic_slug) THEN 'matched'
                         ELSE 'new' END AS state,
                       pj->>'proposal_id' AS proposal_id
                  FROM (SELECT querylayer.proposal_json(
                            (SELECT p.id FROM querylayer.proposals p
                              WHERE p.site_id = s.site_id AND p.type = 'topical_map'
                                AND p.payload->'opportunity_ids' ? s.id::text
                              ORDER BY p.created_at DESC LIMIT 1)) AS pj) x) r
             WHERE s.site_id = querylayer.ctx_site_id()
               AND (p_state IS NULL OR r.state = p_state)
               AND (v_after.after_id IS NULL
                    OR (b.imported_at, s.id) > (v_after.after_key::timestamptz, v_after.after_id))
             ORDER BY b.imported_at, s.id
             LIMIT p_limit + 1) q));
END
$$;
-- Turns selected opportunities into one typed topical_map proposal (new topics and planned
-- pages). The map itself does not change until a member approves.
CREATE FUNCTION querylayer_api.propose_topical_strategy_opportunities(p_run_id uuid, p_opportunity_ids uuid[], p_summary text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_missing uuid;
    v_changes jsonb := '[]';
    v_topics  text[] := '{}';
    o         querylayer.strategy_opportunities;
BEGIN
    PERFORM querylayer.require_connection('topical-map:write'::text);
    IF p_opportunity_ids IS NULL OR cardinality(p_opportunity_ids) NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'opportunity_ids: 1 to 100 ids are required' USING ERRCODE = '22023';
    END IF;
    SELECT x INTO v_missing FROM unnest(p_opportunity_ids) x
     WHERE NOT EXISTS (SELECT 1 FROM querylayer.strategy_opportunities s WHERE s.id = x) LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'opportunity_ids: no imported opportunity % on this site', v_missing USING ERRCODE = 'QL404';
    END IF;
    FOR o IN SELECT * FROM querylayer.strategy_opportunities WHERE id = ANY (p_opportunity_ids) ORDER BY topic_slug, id LOOP
        IF NOT EXISTS (SELECT 1 FROM querylayer.topics WHERE site_id = o.site_id AND slug = o.topic_slug)
           AND NOT o.topic_slug = ANY (v_topics) THEN
            v_changes := v_changes || jsonb_build_object('op', 'add_topic', 'slug', o.topic_slug, 'title', initcap(replace(o.topic_slug, '-', ' ')));
            v_topics := v_topics || o.topic_slug;
        END IF;
        v_changes := v_changes || jsonb_build_object('op', 'plan_page', 'topic', o.topic_slug, 'title', o.title, 'opportunity_id', o.id);
    END LOOP;
    RETURN querylayer.propose(p_run_id, 'topical_map'::text,
        jsonb_build_object('source', 'topical_strategy', 'opportunity_ids', to_jsonb(p_opportunity_ids), 'changes', v_changes),
        p_summary);
END
$$;

-- Newest first; a page of p_limit and the cursor of the next.
CREATE FUNCTION querylayer_api.list_content_briefs(p_limit integer DEFAULT 50, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.require_principal('content:read'::text);
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('briefs'::text, p_cursor);
    RETURN querylayer.page('briefs'::text, 'briefs'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', querylayer.page_key(b.created_at), 'id', b.id, 'item', jsonb_build_object(
                'brief_id', b.id, 'topic', b.topic_slug, 'title', b.title, 'brief', b.brief,
                'commissioned_by_proposal', b.proposal_id, 'created_at', b.created_at,
                'record_sha256', encode(b.record_sha256, 'hex'))) ORDER BY b.created_at DESC, b.id DESC)
          FROM (SELECT * FROM querylayer.content_briefs x
                 WHERE x.site_id = querylayer.ctx_site_id()
                   AND (v_after.after_id IS NULL
                        OR (x.created_at, x.id) < (v_after.after_key::timestamptz, v_after.after_id))
                 ORDER BY x.created_at DESC, x.id DESC LIMIT p_limit + 1) b));
END
$$;
-- Submits contributor output for a brief as an inert create_content (or revision) card. It
-- cannot publish: only a publish_lifecycle approval can. The card cites a revision that a run of
-- this connection wrote (check_payload): attribution cannot be borrowed.
CREATE FUNCTION querylayer_api.propose_content_brief_draft(p_run_id uuid, p_brief_id uuid, p_content_id uuid, p_revision_id uuid,
                                                          p_summary text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_first boolean;
BEGIN
    PERFORM querylayer.require_connection('content:write'::text);
    IF p_brief_id IS NULL THEN
        RAISE EXCEPTION 'brief_id is required' USING ERRCODE = '22023';
    END IF;
    SELECT r.revision_number = 1 INTO v_first FROM querylayer.content_revisions r
     WHERE r.id = p_revision_id AND r.content_id = p_content_id;
    RETURN querylayer.propose(p_run_id, CASE WHEN coalesce(v_first, true) THEN 'create_content' ELSE 'revision' END,
        jsonb_build_object('brief_id', p_brief_id, 'content_id', p_content_id, 'revision_id', p_revision_id), p_summary);
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.list_topical_map, querylayer_api.list_topical_strategy_opportunities,
    querylayer_api.propose_topical_strategy_opportunities, querylayer_api.list_content_briefs,
    querylayer_api.propose_content_brief_draft TO querylayer_edge;

-- Operators import strategy opportunities (with provenance) and may seed the map.
CREATE FUNCTION querylayer_api.import_topical_strategy(p_site text, p_source text, p_opportunities jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site  querylayer.sites;
    v_batch uuid;
    o       jsonb;
    n       integer := 0;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    IF jsonb_typeof(p_opportunities) IS DISTINCT FROM 'array' OR jsonb_array_length(p_opportunities) NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'opportunities: an array of 1 to 10000 items is required' USING ERRCODE = '22023';
    END IF;
    INSERT INTO querylayer.strategy_import_batches (site_id, source, imported_by, record_count)
    VALUES (v_site.id, p_source, querylayer.outer_user(), jsonb_array_length(p_opportunities))
    RETURNING id INTO v_batch;
    FOR o IN SELECT * FROM jsonb_array_elements(p_opportunities) LOOP
        IF (o->>'id') IS NULL OR (o->>'topic') IS NULL OR (o->>'title') IS NULL THEN
            RAISE EXCEPTION 'opportunities[%]: "id", "topic" and "title" are required', n USING ERRCODE = '22023';
        END IF;
        IF (o->>'topic') !~ '^[a-z0-9][a-z0-9-]{0,99}$' THEN
            RAISE EXCEPTION 'opportunities[%].topic: a topic slug is required', n USING ERRCODE = '22023';
        END IF;
        IF o ? 'signals' AND jsonb_typeof(o->'signals') <> 'object' THEN
            RAISE EXCEPTION 'opportunities[%].signals must be an object', n USING ERRCODE = '22023';
        END IF;
        INSERT INTO querylayer.strategy_opportunities (site_id, batch_id, external_id, topic_slug, title, rationale, signals)
        VALUES (v_site.id, v_batch, o->>'id', o->>'topic', o->>'title', o->>'rationale', coalesce(o->'signals', '{}'));
        n := n + 1;
    END LOOP;
    PERFORM querylayer.audit('strategy.import'::text, v_batch::text, jsonb_build_object('source', p_source, 'count', n));
    RETURN jsonb_build_object('import_batch_id', v_batch, 'site', v_site.slug, 'source', p_source, 'imported', n);
END
$$;

CREATE FUNCTION querylayer_api.add_topic(p_site text, p_slug text, p_title text, p_parent text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
    v_id   uuid;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    INSERT INTO querylayer.topics (site_id, slug, title, parent_id)
    VALUES (v_site.id, p_slug, p_title, (SELECT id FROM querylayer.topics WHERE site_id = v_site.id AND slug = p_parent))
    RETURNING id INTO v_id;
    PERFORM querylayer.audit('topic.add'::text, v_id::text, jsonb_build_object('slug', p_slug));
    RETURN jsonb_build_object('topic_id', v_id, 'slug', p_slug);
END
$$;
