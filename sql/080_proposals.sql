-- Proposals (typed AGENT-002 cards), human decisions and their execution. A proposal and its
-- items are immutable; its state is derived from one append-only decision and, for lifecycle
-- proposals, one append-only execution record. Only a member with the right site role decides,
-- once; agents never decide. Publishing, unpublishing, archiving and restoring happen only when
-- an approval executes (extension/src/lifecycle.rs sets the mark the content_items guard needs).

CREATE TABLE querylayer.proposal_types (
    type           text PRIMARY KEY,
    risk           text NOT NULL CHECK (risk IN ('low', 'medium', 'high')),
    required_scope text NOT NULL REFERENCES querylayer.scopes,
    decider_roles  text[] NOT NULL,
    description    text NOT NULL
);
-- Who may decide what: the one table (docs/api.md shows it).
INSERT INTO querylayer.proposal_types (type, risk, required_scope, decider_roles, description) VALUES
    ('create_content',    'medium', 'content:write',     '{owner,admin,editor}', 'a new content item, drafted in a run'),
    ('revision',          'medium', 'content:write',     '{owner,admin,editor}', 'a new revision of an existing item'),
    ('topical_map',       'medium', 'topical-map:write', '{owner,admin,editor}', 'changes to the site''s topical map'),
    ('internal_link',     'low',    'content:write',     '{owner,admin,editor}', 'an internal link between two items'),
    ('publish_lifecycle', 'high',   'publish:request',   '{owner,admin,editor}', 'publish or unpublish items'),
    ('content_lifecycle', 'high',   'publish:request',   '{owner,admin}',        'archive or restore items');

CREATE TABLE querylayer.proposals (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    type           text NOT NULL REFERENCES querylayer.proposal_types ON DELETE RESTRICT,
    risk           text NOT NULL,
    summary        text CHECK (length(summary) <= 2000),
    payload        jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX proposals_site_created ON querylayer.proposals (site_id, created_at DESC);
SELECT querylayer.isolate_by_site('querylayer.proposals'::regclass);
SELECT querylayer.make_attributed('querylayer.proposals'::regclass);
SELECT querylayer.make_chained('querylayer.proposals'::regclass);

-- The server assigns risk from the type, whatever the insert says (a restore keeps the dumped one).
CREATE FUNCTION querylayer.assign_risk() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF querylayer.restoring() THEN
        RETURN NEW;  -- a restore brings the row as it was dumped
    END IF;
    SELECT risk INTO NEW.risk FROM querylayer.proposal_types WHERE type = NEW.type;
    RETURN NEW;
END
$$;
CREATE TRIGGER ab_assign_risk BEFORE INSERT ON querylayer.proposals
    FOR EACH ROW EXECUTE FUNCTION querylayer.assign_risk();
ALTER TABLE querylayer.proposals ENABLE ALWAYS TRIGGER ab_assign_risk;

-- The typed items of lifecycle proposals, with the state each item expects at execution.
CREATE TABLE querylayer.proposal_items (
    proposal_id               uuid NOT NULL REFERENCES querylayer.proposals ON DELETE RESTRICT,
    ordinal                   integer NOT NULL,
    site_id                   uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    content_id                uuid NOT NULL REFERENCES querylayer.content_items ON DELETE RESTRICT,
    action                    text NOT NULL CHECK (action IN ('publish', 'unpublish', 'archive', 'restore')),
    revision_id               uuid REFERENCES querylayer.content_revisions ON DELETE RESTRICT,
    expected_live_revision_id uuid,
    archived_at_snapshot      timestamptz,
    PRIMARY KEY (proposal_id, ordinal),
    CHECK ((action = 'publish') = (revision_id IS NOT NULL)),
    CHECK (action <> 'restore' OR archived_at_snapshot IS NOT NULL)
);
SELECT querylayer.isolate_by_site('querylayer.proposal_items'::regclass);
SELECT querylayer.make_append_only('querylayer.proposal_items'::regclass);

CREATE TABLE querylayer.proposal_decisions (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    proposal_id    uuid NOT NULL UNIQUE REFERENCES querylayer.proposals ON DELETE RESTRICT,
    decision       text NOT NULL CHECK (decision IN ('approved', 'rejected')),
    member_id      uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    member_role    text NOT NULL,
    note           text CHECK (length(note) <= 4000),
    decided_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
SELECT querylayer.isolate_by_site('querylayer.proposal_decisions'::regclass);
SELECT querylayer.make_chained('querylayer.proposal_decisions'::regclass);

-- A decision is an authenticated member's, with a role that may decide this type. Held by the
-- table, so neither a function bug nor a direct insert lets an agent (or anyone) decide.
CREATE FUNCTION querylayer.decision_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_roles text[];
BEGIN
    IF querylayer.restoring() THEN
        RETURN NEW;  -- a restore brings the row as it was dumped
    END IF;
    IF querylayer.ctx_kind() IS DISTINCT FROM 'member' OR NEW.member_id IS DISTINCT FROM querylayer.ctx_member_id() THEN
        RAISE EXCEPTION 'only an authenticated member decides proposals' USING ERRCODE = 'QL403';
    END IF;
    SELECT t.decider_roles INTO v_roles
      FROM querylayer.proposals p JOIN querylayer.proposal_types t ON t.type = p.type
     WHERE p.id = NEW.proposal_id AND p.site_id = NEW.site_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no proposal % on this site', NEW.proposal_id USING ERRCODE = 'QL404';
    END IF;
    NEW.member_role := querylayer.ctx_member_role();
    IF NOT (NEW.member_role = ANY (v_roles)) THEN
        RAISE EXCEPTION 'a member with role % may not decide this proposal (requires one of: %)',
            NEW.member_role, array_to_string(v_roles, ', ') USING ERRCODE = 'QL403';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER aa_decision_guard BEFORE INSERT ON querylayer.proposal_decisions
    FOR EACH ROW EXECUTE FUNCTION querylayer.decision_guard();
ALTER TABLE querylayer.proposal_decisions ENABLE ALWAYS TRIGGER aa_decision_guard;

CREATE TABLE querylayer.proposal_executions (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    decision_id    uuid NOT NULL UNIQUE REFERENCES querylayer.proposal_decisions ON DELETE RESTRICT,
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    proposal_id    uuid NOT NULL UNIQUE REFERENCES querylayer.proposals ON DELETE RESTRICT,
    status         text NOT NULL CHECK (status IN ('applied', 'failed')),
    detail         jsonb NOT NULL,
    executed_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
SELECT querylayer.isolate_by_site('querylayer.proposal_executions'::regclass);
SELECT querylayer.make_chained('querylayer.proposal_executions'::regclass);

CREATE FUNCTION querylayer.execution_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF querylayer.restoring() THEN
        RETURN NEW;  -- a restore brings the row as it was dumped
    END IF;
    IF querylayer.lifecycle_mark() IS DISTINCT FROM NEW.decision_id THEN
        RAISE EXCEPTION 'execution records are written only while an approved decision executes' USING ERRCODE = 'QL423';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER aa_execution_guard BEFORE INSERT ON querylayer.proposal_executions
    FOR EACH ROW EXECUTE FUNCTION querylayer.execution_guard();
ALTER TABLE querylayer.proposal_executions ENABLE ALWAYS TRIGGER aa_execution_guard;

-- -------------------------------------------------------------------------------------------
-- Payload validation, per type. Returns {payload, items}; errors name the offending field.

CREATE FUNCTION querylayer.payload_uuid(p jsonb, p_path text) RETURNS uuid
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_typeof(p) IS DISTINCT FROM 'string' OR (p#>>'{}') !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN
        RAISE EXCEPTION '%: a UUID string is required', p_path USING ERRCODE = '22023';
    END IF;
    RETURN (p#>>'{}')::uuid;
END
$$;

CREATE FUNCTION querylayer.lifecycle_items(p_type text, p_payload jsonb) RETURNS SETOF querylayer.proposal_items
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_item   jsonb;
    v_n      integer := 0;
    v_seen   uuid[] := '{}';
    v_path   text;
    v_cid    uuid;
    v_action text;
    v_row    querylayer.proposal_items;
    v_ci     querylayer.content_items;
    v_snap   timestamptz;
BEGIN
    IF jsonb_typeof(p_payload->'items') IS DISTINCT FROM 'array' OR jsonb_array_length(p_payload->'items') = 0 THEN
        RAISE EXCEPTION 'items: a non-empty array is required' USING ERRCODE = '22023';
    END IF;
    IF jsonb_array_length(p_payload->'items') > 100 THEN
        RAISE EXCEPTION 'items: at most 100 per proposal' USING ERRCODE = '22023';
    END IF;
    FOR v_item IN SELECT * FROM jsonb_array_elements(p_payload->'items') LOOP
        v_path := format('items[%s]', v_n);
        IF jsonb_typeof(v_item) <> 'object' THEN
            RAISE EXCEPTION '%: an object is required', v_path USING ERRCODE = '22023';
        END IF;
        v_cid := querylayer.payload_uuid(v_item->'content_id', v_path || '.content_id');
        IF v_cid = ANY (v_seen) THEN
            RAISE EXCEPTION '%.content_id: the item appears twice in this proposal', v_path USING ERRCODE = '22023';
        END IF;
        v_seen := v_seen || v_cid;
        SELECT * INTO v_ci FROM querylayer.content_items WHERE id = v_cid;
        IF NOT FOUND THEN
            RAISE EXCEPTION '%.content_id: no content item % on this site', v_path, v_cid USING ERRCODE = 'QL404';
        END IF;
        v_action := v_item->>'action';
        v_row := ROW(NULL, v_n, v_ci.site_id, v_cid, v_action, NULL, NULL, NULL)::querylayer.proposal_items;
        IF p_type = 'publish_lifecycle' THEN
            IF v_action = 'publish' THEN
                v_row.revision_id := querylayer.payload_uuid(v_item->'revision_id', v_path || '.revision_id');
                IF v_ci.archived_at IS NOT NULL THEN
                    RAISE EXCEPTION '%: item % is archived; restore it first', v_path, v_cid USING ERRCODE = 'QL422';
                END IF;
                IF v_ci.draft_revision_id IS DISTINCT FROM v_row.revision_id THEN
                    RAISE EXCEPTION '%.revision_id: % is not the current draft of item % (the draft is %)',
                        v_path, v_row.revision_id, v_cid, v_ci.draft_revision_id USING ERRCODE = 'QL422';
                END IF;
                v_row.expected_live_revision_id := v_ci.published_revision_id;
            ELSIF v_action = 'unpublish' THEN
                IF v_item ? 'revision_id' AND v_item->'revision_id' <> 'null'::jsonb THEN
                    RAISE EXCEPTION '%.revision_id: unpublish carries no revision; the server takes down whatever is live',
                        v_path USING ERRCODE = '22023';
                END IF;
                IF v_ci.published_revision_id IS NULL THEN
                    RAISE EXCEPTION '%: item % is not live', v_path, v_cid USING ERRCODE = 'QL422';
                END IF;
            ELSE
                RAISE EXCEPTION '%.action: publish or unpublish is required', v_path USING ERRCODE = '22023';
            END IF;
        ELSE
            IF NOT v_item ? 'archived_at' THEN
                RAISE EXCEPTION '%.archived_at: the exact archived_at snapshot is required (null when not archived)', v_path
                    USING ERRCODE = '22023';
            END IF;
            BEGIN
                v_snap := (v_item->>'archived_at')::timestamptz;
            EXCEPTION WHEN others THEN
                RAISE EXCEPTION '%.archived_at: a timestamp or null is required', v_path USING ERRCODE = '22023';
            END;
            v_row.archived_at_snapshot := v_snap;
            IF v_ci.archived_at IS DISTINCT FROM v_snap THEN
                RAISE EXCEPTION '%.archived_at: the snapshot does not match the item (archived_at is %)', v_path,
                    coalesce(v_ci.archived_at::text, 'null') USING ERRCODE = 'QL422';
            END IF;
            IF v_action = 'archive' THEN
                IF v_snap IS NOT NULL THEN
                    RAISE EXCEPTION '%: item % is already archived', v_path, v_cid USING ERRCODE = 'QL422';
                END IF;
                IF v_ci.published_revision_id IS NOT NULL THEN
                    RAISE EXCEPTION '%: item % is live; unpublish it before archiving', v_path, v_cid USING ERRCODE = 'QL422';
                END IF;
            ELSIF v_action = 'restore' THEN
                IF v_snap IS NULL THEN
                    RAISE EXCEPTION '%: item % is not archived', v_path, v_cid USING ERRCODE = 'QL422';
                END IF;
            ELSE
                RAISE EXCEPTION '%.action: archive or restore is required', v_path USING ERRCODE = '22023';
            END IF;
        END IF;
        v_n := v_n + 1;
        RETURN NEXT v_row;
    END LOOP;
END
$$;

CREATE FUNCTION querylayer.check_payload(p_type text, p_payload jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_cid uuid;
    v_rid uuid;
    v_rev querylayer.content_revisions;
BEGIN
    IF p_payload IS NULL OR jsonb_typeof(p_payload) <> 'object' THEN
        RAISE EXCEPTION 'payload must be a JSON object' USING ERRCODE = '22023';
    END IF;
    -- Risk is the server's; a client-supplied one is dropped.
    p_payload := p_payload - 'risk';
    IF p_type IN ('create_content', 'revision') THEN
        v_cid := querylayer.payload_uuid(p_payload->'content_id', 'payload.content_id'::text);
        v_rid := querylayer.payload_uuid(p_payload->'revision_id', 'payload.revision_id'::text);
        SELECT * INTO v_rev FROM querylayer.content_revisions WHERE id = v_rid AND content_id = v_cid;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'payload.revision_id: no revision % of item % on this site', v_rid, v_cid USING ERRCODE = 'QL404';
        END IF;
        -- Attribution cannot be borrowed: a card is its author's contributor output, so it cites
        -- only a revision that a run of the proposing connection wrote.
        IF v_rev.connection_id IS DISTINCT FROM querylayer.ctx_connection_id() THEN
            RAISE EXCEPTION 'payload.revision_id: revision % was not written by this connection''s runs; a card cites only its own work',
                v_rid USING ERRCODE = 'QL403',
                HINT = 'write the revision with querylayer_create_draft in a run of this connection, then propose it';
        END IF;
        -- Contributor output may cite what commissioned or fed it (a brief, staged source records).
        PERFORM querylayer.check_draft_references(p_payload);
    ELSIF p_type = 'internal_link' THEN
        FOREACH v_cid IN ARRAY ARRAY[querylayer.payload_uuid(p_payload->'from_content_id', 'payload.from_content_id'::text),
                                      querylayer.payload_uuid(p_payload->'to_content_id', 'payload.to_content_id'::text)] LOOP
            IF NOT EXISTS (SELECT 1 FROM querylayer.content_items WHERE id = v_cid) THEN
                RAISE EXCEPTION 'payload: no content item % on this site', v_cid USING ERRCODE = 'QL404';
            END IF;
        END LOOP;
        IF jsonb_typeof(p_payload->'anchor_text') IS DISTINCT FROM 'string'
           OR length(p_payload->>'anchor_text') NOT BETWEEN 1 AND 200 THEN
            RAISE EXCEPTION 'payload.anchor_text: 1 to 200 characters are required' USING ERRCODE = '22023';
        END IF;
    ELSIF p_type = 'topical_map' THEN
        PERFORM querylayer.check_topical_changes(p_payload);
    ELSIF p_type IN ('publish_lifecycle', 'content_lifecycle') THEN
        PERFORM count(*) FROM querylayer.lifecycle_items(p_type, p_payload);
    END IF;
    RETURN p_payload;
END
$$;

-- Why one lifecycle item can no longer execute as requested, or NULL: the one rule that both the
-- execution (apply_lifecycle) and the stale warning of a pending proposal (proposal_json) apply.
CREATE FUNCTION querylayer.lifecycle_problem(it querylayer.proposal_items, ci querylayer.content_items) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN CASE
        WHEN it.action = 'publish' AND ci.archived_at IS NOT NULL THEN
            jsonb_build_object('content_id', ci.id, 'reason', 'archived', 'message', 'the item was archived')
        WHEN it.action = 'publish' AND ci.draft_revision_id IS DISTINCT FROM it.revision_id THEN
            jsonb_build_object('content_id', ci.id, 'reason', 'stale_revision',
                'message', format('revision %s is no longer the current draft (now %s)', it.revision_id, ci.draft_revision_id))
        WHEN it.action = 'publish' AND ci.published_revision_id IS DISTINCT FROM it.expected_live_revision_id THEN
            jsonb_build_object('content_id', ci.id, 'reason', 'live_changed',
                'message', 'the live page changed since this request was made')
        WHEN it.action = 'unpublish' AND ci.published_revision_id IS NULL THEN
            jsonb_build_object('content_id', ci.id, 'reason', 'not_live', 'message', 'nothing is live to take down')
        WHEN it.action IN ('archive', 'restore') AND ci.archived_at IS DISTINCT FROM it.archived_at_snapshot THEN
            jsonb_build_object('content_id', ci.id, 'reason', 'snapshot_mismatch',
                'message', format('archived_at is %s, the proposal expected %s',
                                  coalesce(ci.archived_at::text, 'null'), coalesce(it.archived_at_snapshot::text, 'null')))
        WHEN it.action = 'archive' AND ci.published_revision_id IS NOT NULL THEN
            jsonb_build_object('content_id', ci.id, 'reason', 'live', 'message', 'the item is live; unpublish it first')
    END;
END
$$;

-- The problems a pending lifecycle proposal would meet if it were approved now (empty when it
-- is current): the "stale" warning members see before they decide.
CREATE FUNCTION querylayer.proposal_problems(p_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT coalesce(jsonb_agg(x.problem ORDER BY x.ordinal), '[]')
      FROM (SELECT i.ordinal, querylayer.lifecycle_problem(i, c) AS problem
              FROM querylayer.proposal_items i JOIN querylayer.content_items c ON c.id = i.content_id
             WHERE i.proposal_id = p_id) x
     WHERE x.problem IS NOT NULL);
END
$$;

-- A proposal as the API shows it. Its state's rule is written again in list_proposals' filter.
CREATE FUNCTION querylayer.proposal_json(p_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT jsonb_build_object(
        'proposal_id', p.id, 'type', p.type, 'risk', p.risk,
        'state', CASE WHEN d.id IS NULL THEN 'pending' WHEN d.decision = 'rejected' THEN 'rejected'
                      WHEN e.status = 'applied' THEN 'applied' WHEN e.status = 'failed' THEN 'failed'
                      ELSE 'approved' END,
        'summary', p.summary, 'payload', p.payload,
        'items', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                        'content_id', i.content_id, 'action', i.action, 'revision_id', i.revision_id,
                        'archived_at', i.archived_at_snapshot) ORDER BY i.ordinal), '[]')
                    FROM querylayer.proposal_items i WHERE i.proposal_id = p.id),
        'author', jsonb_build_object('kind', p.author_kind, 'agent_id', p.agent_id, 'connection_id', p.connection_id,
                                     'run_id', p.run_id, 'member_id', p.member_id),
        'created_at', p.created_at,
        'decision', CASE WHEN d.id IS NOT NULL THEN jsonb_build_object(
                        'decision', d.decision, 'member_id', d.member_id, 'member_role', d.member_role,
                        'note', d.note, 'decided_at', d.decided_at) END,
        'execution', CASE WHEN e.decision_id IS NOT NULL THEN jsonb_build_object(
                        'status', e.status, 'detail', e.detail, 'executed_at', e.executed_at) END,
        -- A pending lifecycle request whose items moved since it was made (the draft changed,
        -- the live page changed, the item was archived): approving it would change nothing.
        'stale', jsonb_array_length(pp.problems) > 0,
        'stale_problems', pp.problems)
      FROM querylayer.proposals p
      LEFT JOIN querylayer.proposal_decisions d ON d.proposal_id = p.id
      LEFT JOIN querylayer.proposal_executions e ON e.proposal_id = p.id
      CROSS JOIN LATERAL (SELECT CASE WHEN d.id IS NULL AND p.type IN ('publish_lifecycle', 'content_lifecycle')
                                      THEN querylayer.proposal_problems(p.id) ELSE '[]'::jsonb END AS problems) pp
     WHERE p.id = p_id);
END
$$;

CREATE FUNCTION querylayer.proposal_state_filter(p_state text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_state IS NOT NULL AND p_state NOT IN ('pending', 'approved', 'applied', 'failed', 'rejected') THEN
        RAISE EXCEPTION 'state must be pending, approved, applied, failed or rejected; got %', quote_literal(p_state)
            USING ERRCODE = '22023';
    END IF;
    RETURN p_state;
END
$$;

-- Newest first, optionally of one state; a page of p_limit and the cursor of the next. The state
-- is filtered on the decision and execution rows, with proposal_json's rule written again here
-- (pg_tests/proposals.rs holds the two equal for every state), so only the page's proposals are
-- written as JSON: filtering on proposal_json's answer wrote every proposal the scan passed,
-- and a site's decided history is passed over to find its pending few.
CREATE FUNCTION querylayer.list_proposals(p_state text, p_limit integer, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.proposal_state_filter(p_state);
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('proposals'::text, p_cursor);
    RETURN querylayer.page('proposals'::text, 'proposals'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('item', querylayer.proposal_json(x.id), 'key', querylayer.page_key(x.created_at),
                                            'id', x.id)
                         ORDER BY x.created_at DESC, x.id DESC)
          FROM (SELECT p.id, p.created_at
                  FROM querylayer.proposals p
                  LEFT JOIN querylayer.proposal_decisions d ON d.proposal_id = p.id
                  LEFT JOIN querylayer.proposal_executions e ON e.proposal_id = p.id
                 WHERE p.site_id = querylayer.ctx_site_id()
                   AND (v_after.after_id IS NULL
                        OR (p.created_at, p.id) < (v_after.after_key::timestamptz, v_after.after_id))
                   AND (p_state IS NULL
                        OR p_state = CASE WHEN d.id IS NULL THEN 'pending' WHEN d.decision = 'rejected' THEN 'rejected'
                                          WHEN e.status = 'applied' THEN 'applied' WHEN e.status = 'failed' THEN 'failed'
                                          ELSE 'approved' END)
                 ORDER BY p.created_at DESC, p.id DESC LIMIT p_limit + 1) x));
END
$$;

-- Creates a proposal for the acting connection (agents propose; members decide).
CREATE FUNCTION querylayer.propose(p_run_id uuid, p_type text, p_payload jsonb, p_summary text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_type    querylayer.proposal_types;
    v_payload jsonb;
    v_id      uuid;
BEGIN
    PERFORM querylayer.require_connection(NULL::text);
    SELECT * INTO v_type FROM querylayer.proposal_types WHERE type = p_type;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'type must be one of %; got %',
            (SELECT string_agg(type, ', ' ORDER BY type) FROM querylayer.proposal_types),
            coalesce(quote_literal(p_type), 'NULL') USING ERRCODE = '22023';
    END IF;
    PERFORM querylayer.require_connection(v_type.required_scope);
    IF p_run_id IS NULL THEN
        RAISE EXCEPTION 'run_id is required: a proposal belongs to an open run of its connection' USING ERRCODE = '22023';
    END IF;
    IF p_summary IS NOT NULL AND length(p_summary) > 2000 THEN
        RAISE EXCEPTION 'summary: at most 2000 characters' USING ERRCODE = '22023';
    END IF;
    v_payload := querylayer.check_payload(p_type, p_payload);
    INSERT INTO querylayer.proposals (site_id, type, risk, summary, payload, author_kind, agent_id, connection_id, run_id)
    VALUES (querylayer.ctx_site_id(), p_type, v_type.risk, p_summary, v_payload, 'agent',
            querylayer.ctx_agent_id(), querylayer.ctx_connection_id(), p_run_id)
    RETURNING id INTO v_id;
    IF p_type IN ('publish_lifecycle', 'content_lifecycle') THEN
        INSERT INTO querylayer.proposal_items
        SELECT v_id, i.ordinal, i.site_id, i.content_id, i.action, i.revision_id, i.expected_live_revision_id,
               i.archived_at_snapshot
          FROM querylayer.lifecycle_items(p_type, v_payload) i;
    END IF;
    PERFORM querylayer.audit('proposal.create'::text, v_id::text, jsonb_build_object('type', p_type, 'run_id', p_run_id));
    RETURN querylayer.proposal_json(v_id);
END
$$;

-- Called only by the extension's execute_decision: is this an approval, of a lifecycle
-- proposal, made in this very transaction by the member acting now, and not executed yet?
-- Types whose approval changes governed state when it executes.
CREATE FUNCTION querylayer.executes_on_approval(p_type text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN p_type IN ('publish_lifecycle', 'content_lifecycle', 'topical_map');
END
$$;

CREATE FUNCTION querylayer.decision_executable(p_decision uuid) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce((
        SELECT d.decision = 'approved'
           AND querylayer.executes_on_approval(p.type)
           AND querylayer.ctx_kind() = 'member'
           AND d.member_id = querylayer.ctx_member_id()
           AND d.xmin = pg_catalog.pg_current_xact_id()::xid
           AND NOT EXISTS (SELECT 1 FROM querylayer.proposal_executions e WHERE e.decision_id = d.id)
          FROM querylayer.proposal_decisions d JOIN querylayer.proposals p ON p.id = d.proposal_id
         WHERE d.id = p_decision), false);
END
$$;

-- Executes an approved decision under the mark, by type (the extension's execute_decision
-- calls this and nothing else does anything under the mark).
CREATE FUNCTION querylayer.apply_decision(p_decision uuid) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_type text;
BEGIN
    SELECT p.type INTO STRICT v_type FROM querylayer.proposal_decisions d JOIN querylayer.proposals p ON p.id = d.proposal_id
     WHERE d.id = p_decision;
    IF v_type = 'topical_map' THEN
        RETURN querylayer.apply_topical_map(p_decision);
    END IF;
    RETURN querylayer.apply_lifecycle(p_decision);
END
$$;

-- Executes an approved lifecycle proposal, all items or none. Runs under the lifecycle mark.
-- Locks the items, re-checks every expectation against the current rows, then applies.
CREATE FUNCTION querylayer.apply_lifecycle(p_decision uuid) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_dec      querylayer.proposal_decisions;
    v_items    querylayer.proposal_items[];
    it         querylayer.proposal_items;
    ci         querylayer.content_items;
    v_problems jsonb := '[]';
    v_effects  jsonb := '[]';
    v_status   text;
BEGIN
    SELECT * INTO STRICT v_dec FROM querylayer.proposal_decisions WHERE id = p_decision;
    SELECT array_agg(i ORDER BY i.ordinal) INTO v_items FROM querylayer.proposal_items i WHERE i.proposal_id = v_dec.proposal_id;
    -- Lock in a stable order so concurrent executions queue instead of deadlocking.
    PERFORM 1 FROM querylayer.content_items
     WHERE id IN (SELECT (unnest(v_items)).content_id) ORDER BY id FOR UPDATE;
    FOREACH it IN ARRAY v_items LOOP
        SELECT * INTO ci FROM querylayer.content_items WHERE id = it.content_id;
        v_problems := v_problems || coalesce(querylayer.lifecycle_problem(it, ci), '[]'::jsonb);
    END LOOP;
    IF jsonb_array_length(v_problems) > 0 THEN
        v_status := 'failed';
    ELSE
        v_status := 'applied';
        FOREACH it IN ARRAY v_items LOOP
            SELECT * INTO ci FROM querylayer.content_items WHERE id = it.content_id;
            IF it.action = 'publish' THEN
                UPDATE querylayer.content_items SET published_revision_id = it.revision_id, published_at = now(), updated_at = now()
                 WHERE id = it.content_id;
            ELSIF it.action = 'unpublish' THEN
                UPDATE querylayer.content_items SET published_revision_id = NULL, published_at = NULL, updated_at = now()
                 WHERE id = it.content_id;
            ELSIF it.action = 'archive' THEN
                UPDATE querylayer.content_items SET archived_at = clock_timestamp(), updated_at = now() WHERE id = it.content_id;
            ELSE
                -- Restoring never republishes: the live pointer stays empty.
                UPDATE querylayer.content_items SET archived_at = NULL, updated_at = now() WHERE id = it.content_id;
            END IF;
            v_effects := v_effects || jsonb_build_object('content_id', it.content_id, 'action', it.action,
                'revision_id', CASE WHEN it.action = 'unpublish' THEN ci.published_revision_id ELSE it.revision_id END);
        END LOOP;
    END IF;
    INSERT INTO querylayer.proposal_executions (decision_id, site_id, proposal_id, status, detail)
    VALUES (v_dec.id, v_dec.site_id, v_dec.proposal_id, v_status,
            CASE v_status WHEN 'applied' THEN jsonb_build_object('effects', v_effects)
                          ELSE jsonb_build_object('problems', v_problems, 'message', 'nothing was changed') END);
    RETURN jsonb_build_object('status', v_status, 'effects', v_effects, 'problems', v_problems);
END
$$;

-- -------------------------------------------------------------------------------------------
-- The callable surface.

CREATE FUNCTION querylayer_api.create_proposal(p_run_id uuid, p_type text, p_payload jsonb, p_summary text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN querylayer.propose(p_run_id, p_type, p_payload, p_summary);
END
$$;

CREATE FUNCTION querylayer_api.request_publish_approval(p_run_id uuid, p_items jsonb, p_summary text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_connection('publish:request'::text);
    RETURN querylayer.propose(p_run_id, 'publish_lifecycle'::text, jsonb_build_object('items', p_items), p_summary);
END
$$;

CREATE FUNCTION querylayer_api.list_proposals(p_state text DEFAULT NULL, p_limit integer DEFAULT 50, p_cursor text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_principal('content:read'::text);
    RETURN querylayer.list_proposals(p_state, p_limit, p_cursor);
END
$$;

-- A member approves or rejects, once. An approved lifecycle proposal executes at once, in the
-- same transaction: all of its items or (stale, live, snapshot mismatch) none, and the record
-- says which and why.
CREATE FUNCTION querylayer_api.decide_proposal(p_proposal_id uuid, p_decision text, p_note text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_prop     querylayer.proposals;
    v_roles    text[];
    v_decision querylayer.proposal_decisions;
    v_prior    querylayer.proposal_decisions;
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    IF p_decision IS NULL OR p_decision NOT IN ('approve', 'reject') THEN
        RAISE EXCEPTION 'decision must be approve or reject; got %', coalesce(quote_literal(p_decision), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v_prop FROM querylayer.proposals WHERE id = p_proposal_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no proposal % on this site', p_proposal_id USING ERRCODE = 'QL404';
    END IF;
    SELECT decider_roles INTO v_roles FROM querylayer.proposal_types WHERE type = v_prop.type;
    PERFORM querylayer.require_member(v_roles);
    SELECT * INTO v_prior FROM querylayer.proposal_decisions WHERE proposal_id = p_proposal_id;
    IF FOUND THEN
        RAISE EXCEPTION 'proposal % was already % at %', p_proposal_id, v_prior.decision, v_prior.decided_at
            USING ERRCODE = 'QL409';
    END IF;
    INSERT INTO querylayer.proposal_decisions (site_id, proposal_id, decision, member_id, member_role, note)
    VALUES (v_prop.site_id, v_prop.id, CASE p_decision WHEN 'approve' THEN 'approved' ELSE 'rejected' END,
            querylayer.ctx_member_id(), querylayer.ctx_member_role(), p_note)
    RETURNING * INTO v_decision;
    IF v_decision.decision = 'approved' AND querylayer.executes_on_approval(v_prop.type) THEN
        PERFORM querylayer.execute_decision(v_decision.id);
    END IF;
    PERFORM querylayer.audit('proposal.decide'::text, v_prop.id::text,
        jsonb_build_object('decision', v_decision.decision, 'type', v_prop.type));
    RETURN querylayer.proposal_json(v_prop.id);
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.create_proposal, querylayer_api.request_publish_approval,
    querylayer_api.list_proposals, querylayer_api.decide_proposal TO querylayer_edge;

CREATE FUNCTION querylayer_api.console_list_proposals(p_state text DEFAULT 'pending', p_limit integer DEFAULT 50,
                                                      p_cursor text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    RETURN querylayer.list_proposals(p_state, p_limit, p_cursor);
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.console_list_proposals TO querylayer_edge;
