-- Verifiable history (docs/ledger.md). Two halves:
--
-- The live state is part of history. Every move of a content item's published_revision_id,
-- published_at and archived_at, and every change of the topical map (topics, topic_pages), is a
-- chained state event written by an AFTER trigger, naming the decision executing it (the approval
-- mark) or the operator. The live rows must equal the replay of their events: a change made
-- without the triggers (ALTER TABLE … ALTER COLUMN … USING, a disabled trigger) leaves the live
-- state and its history apart, and the verifier says where.
--
-- Signed checkpoints. For each site, the number of records in its chain, the chain's head, the
-- RFC 9162 Merkle root over one leaf per record (querylayer-ledger, ledger/src/record.rs), the
-- time and the previous checkpoint's hash, signed with the server key (extension/src/ledger.rs).
-- Checkpoints are made here, on demand or by the worker, and carried by `querylayer ledger` and
-- the worker to witnesses outside the database; a history rewritten after a checkpoint was
-- witnessed no longer produces it.

-- -------------------------------------------------------------------------------------------
-- The live state as chained events.

CREATE TABLE querylayer.state_events (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id     uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    -- content_item (its id), topic (its id), topic_page ('<topic_id>/<content_id>').
    subject     text NOT NULL CHECK (subject IN ('content_item', 'topic', 'topic_page')),
    subject_id  text NOT NULL,
    -- The subject's state after the change (querylayer.live_state); NULL when it is gone.
    state       jsonb,
    -- decision: an approved decision executing (decision_id); operator: an operator function
    -- (actor); baseline: the state an upgrade found, before events were kept.
    cause       text NOT NULL CHECK (cause IN ('decision', 'operator', 'baseline')),
    decision_id uuid REFERENCES querylayer.proposal_decisions ON DELETE RESTRICT,
    actor       text,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((cause = 'decision') = (decision_id IS NOT NULL))
);
SELECT querylayer.isolate_by_site('querylayer.state_events'::regclass);
SELECT querylayer.make_chained('querylayer.state_events'::regclass);
CREATE INDEX state_events_subject ON querylayer.state_events (site_id, subject, subject_id, chain_seq);

-- The key of a live row (its row as jsonb).
CREATE FUNCTION querylayer.live_state_key(p_subject text, p_row jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN CASE p_subject WHEN 'topic_page' THEN (p_row->>'topic_id') || '/' || (p_row->>'content_id')
                          ELSE p_row->>'id' END;
END
$$;

-- The governed state of a live row (its row as jsonb, timestamps in UTC): what its events record.
-- The verifier (edge/src/ledger/verify.rs) reads the same fields.
CREATE FUNCTION querylayer.live_state(p_subject text, p_row jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN CASE p_subject
        WHEN 'content_item' THEN jsonb_build_object('published_revision_id', p_row->'published_revision_id',
                                                    'published_at', p_row->'published_at', 'archived_at', p_row->'archived_at')
        WHEN 'topic' THEN jsonb_build_object('slug', p_row->'slug', 'title', p_row->'title', 'parent_id', p_row->'parent_id')
        WHEN 'topic_page' THEN jsonb_build_object('topic_id', p_row->'topic_id', 'content_id', p_row->'content_id',
                                                  'role', p_row->'role')
    END;
END
$$;

-- AFTER trigger of the live tables (the subject follows from the table). A restore brings the
-- events as they were dumped, so it writes none.
CREATE FUNCTION querylayer.record_state_event() RETURNS trigger
LANGUAGE plpgsql SET "TimeZone" = 'UTC' AS $$
DECLARE
    v_subject text := CASE TG_TABLE_NAME WHEN 'content_items' THEN 'content_item' WHEN 'topics' THEN 'topic'
                                         WHEN 'topic_pages' THEN 'topic_page' END;
    v_mark    uuid := querylayer.lifecycle_mark();
    v_old     jsonb;
    v_new     jsonb;
    v_site    uuid;
BEGIN
    IF querylayer.restoring() THEN
        RETURN NULL;
    END IF;
    -- Most updates of a content item move only its draft pointer: its key and governed state
    -- (querylayer.live_state_key, querylayer.live_state) are unchanged, which the columns
    -- themselves say without building either row's JSON. No event, as below.
    IF TG_OP = 'UPDATE' AND TG_TABLE_NAME = 'content_items' THEN
        IF (NEW.id, NEW.published_revision_id, NEW.published_at, NEW.archived_at)
           IS NOT DISTINCT FROM (OLD.id, OLD.published_revision_id, OLD.published_at, OLD.archived_at) THEN
            RETURN NULL;
        END IF;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        v_old := to_jsonb(OLD);
        v_site := OLD.site_id;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        v_new := to_jsonb(NEW);
        v_site := NEW.site_id;
    END IF;
    -- An update that leaves the governed state as it was is no event.
    IF TG_OP = 'UPDATE' AND querylayer.live_state_key(v_subject, v_old) = querylayer.live_state_key(v_subject, v_new)
       AND querylayer.live_state(v_subject, v_old) = querylayer.live_state(v_subject, v_new) THEN
        RETURN NULL;
    END IF;
    -- A row whose key changed is a row gone and a row added.
    IF v_old IS NOT NULL AND (v_new IS NULL OR querylayer.live_state_key(v_subject, v_old) <> querylayer.live_state_key(v_subject, v_new)) THEN
        INSERT INTO querylayer.state_events (site_id, subject, subject_id, state, cause, decision_id, actor)
        VALUES (OLD.site_id, v_subject, querylayer.live_state_key(v_subject, v_old), NULL,
                CASE WHEN v_mark IS NULL THEN 'operator' ELSE 'decision' END, v_mark,
                CASE WHEN v_mark IS NULL THEN 'operator:' || querylayer.outer_user() END);
    END IF;
    IF v_new IS NOT NULL THEN
        INSERT INTO querylayer.state_events (site_id, subject, subject_id, state, cause, decision_id, actor)
        VALUES (v_site, v_subject, querylayer.live_state_key(v_subject, v_new), querylayer.live_state(v_subject, v_new),
                CASE WHEN v_mark IS NULL THEN 'operator' ELSE 'decision' END, v_mark,
                CASE WHEN v_mark IS NULL THEN 'operator:' || querylayer.outer_user() END);
    END IF;
    RETURN NULL;
END
$$;

-- Content items start unpublished and unarchived (content_items_guard), so only updates move them.
-- (No WHEN clause naming the columns: the trigger must not depend on them.)
CREATE TRIGGER zz_state_event AFTER UPDATE ON querylayer.content_items FOR EACH ROW
    EXECUTE FUNCTION querylayer.record_state_event();
ALTER TABLE querylayer.content_items ENABLE ALWAYS TRIGGER zz_state_event;
CREATE TRIGGER zz_state_event AFTER INSERT OR UPDATE OR DELETE ON querylayer.topics FOR EACH ROW
    EXECUTE FUNCTION querylayer.record_state_event();
ALTER TABLE querylayer.topics ENABLE ALWAYS TRIGGER zz_state_event;
CREATE TRIGGER zz_state_event AFTER INSERT OR UPDATE OR DELETE ON querylayer.topic_pages FOR EACH ROW
    EXECUTE FUNCTION querylayer.record_state_event();
ALTER TABLE querylayer.topic_pages ENABLE ALWAYS TRIGGER zz_state_event;

-- The first events of a database whose live state was kept before events were: one baseline
-- event per published or archived item, topic and topic page, by `p_actor` (the upgrade from
-- 0.1.0 calls it). Returns how many it wrote.
CREATE FUNCTION querylayer.record_state_baseline(p_actor text) RETURNS bigint
LANGUAGE plpgsql SET "TimeZone" = 'UTC' AS $$
DECLARE
    v_count bigint;
BEGIN
    WITH live AS (
        SELECT i.site_id, 'content_item' AS subject, to_jsonb(i) AS r, i.created_at AS since FROM querylayer.content_items i
         WHERE i.published_revision_id IS NOT NULL OR i.published_at IS NOT NULL OR i.archived_at IS NOT NULL
        UNION ALL
        SELECT t.site_id, 'topic', to_jsonb(t), t.created_at FROM querylayer.topics t
        UNION ALL
        SELECT p.site_id, 'topic_page', to_jsonb(p), p.added_at FROM querylayer.topic_pages p
    ), added AS (
        INSERT INTO querylayer.state_events (site_id, subject, subject_id, state, cause, actor)
        SELECT l.site_id, l.subject, querylayer.live_state_key(l.subject, l.r), querylayer.live_state(l.subject, l.r),
               'baseline', p_actor
          FROM live l
         WHERE NOT EXISTS (SELECT 1 FROM querylayer.state_events e
                            WHERE e.site_id = l.site_id AND e.subject = l.subject
                              AND e.subject_id = querylayer.live_state_key(l.subject, l.r))
         ORDER BY l.site_id, l.since, l.subject, querylayer.live_state_key(l.subject, l.r)
        RETURNING 1
    )
    SELECT count(*) INTO v_count FROM added;
    RETURN v_count;
END
$$;

-- Replays a site's state events and compares them with its live rows: the first difference, or
-- NULL. (The offline verifier does the same from the canonical records, outside the database.)
CREATE FUNCTION querylayer.live_state_problem(p_site uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE SET "TimeZone" = 'UTC' AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        WITH replayed AS (
            -- The newest event of each subject: the chain's order, then pending ones (newer than
            -- any sealed event of their subject) in the order they were written.
            SELECT DISTINCT ON (e.subject, e.subject_id) e.subject, e.subject_id, e.state, e.id, e.chain_seq
              FROM querylayer.state_events e
              LEFT JOIN querylayer.ledger_pending p ON p.record_id = e.id AND p.site_id = e.site_id
             WHERE e.site_id = p_site
             ORDER BY e.subject, e.subject_id, e.chain_seq DESC NULLS FIRST, p.written DESC
        ), live AS (
            SELECT 'content_item' AS subject, i.id::text AS subject_id, querylayer.live_state('content_item'::text, to_jsonb(i)) AS state
              FROM querylayer.content_items i WHERE i.site_id = p_site
            UNION ALL
            SELECT 'topic', t.id::text, querylayer.live_state('topic'::text, to_jsonb(t)) FROM querylayer.topics t WHERE t.site_id = p_site
            UNION ALL
            SELECT 'topic_page', p.topic_id::text || '/' || p.content_id::text, querylayer.live_state('topic_page'::text, to_jsonb(p))
              FROM querylayer.topic_pages p WHERE p.site_id = p_site
        )
        SELECT coalesce(l.subject, x.subject) AS subject, coalesce(l.subject_id, x.subject_id) AS subject_id,
               l.state AS live, x.state AS replayed, x.id AS event_id, x.chain_seq
          FROM live l FULL JOIN replayed x ON x.subject = l.subject AND x.subject_id = l.subject_id
         WHERE l.state IS DISTINCT FROM x.state
           -- An item never moved has no event: its state is the empty one.
           AND NOT (x.subject IS NULL AND l.subject = 'content_item'
                    AND l.state = jsonb_build_object('published_revision_id', NULL, 'published_at', NULL, 'archived_at', NULL))
         ORDER BY 1, 2
         LIMIT 1
    LOOP
        RETURN jsonb_build_object('subject', r.subject, 'subject_id', r.subject_id, 'live', r.live,
                                  'replayed', r.replayed, 'last_event_id', r.event_id, 'last_event_seq', r.chain_seq);
    END LOOP;
    RETURN NULL;
END
$$;

-- -------------------------------------------------------------------------------------------
-- Signed checkpoints.

CREATE TABLE querylayer.ledger_checkpoints (
    site_id           uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    seq               bigint NOT NULL CHECK (seq > 0),
    head_sha256       bytea NOT NULL CHECK (length(head_sha256) = 32),
    tree_root         bytea NOT NULL CHECK (length(tree_root) = 32),
    checkpointed_at   timestamptz NOT NULL,
    prev_sha256       bytea CHECK (length(prev_sha256) = 32),
    checkpoint_sha256 bytea NOT NULL UNIQUE CHECK (length(checkpoint_sha256) = 32),
    server_key_id     uuid NOT NULL REFERENCES querylayer.server_keys ON DELETE RESTRICT,
    signature         text NOT NULL,
    -- The roots of the tree's perfect subtrees (largest first, 32 bytes each, end to end): the
    -- next checkpoint extends the tree from here. Not signed; a wrong frontier only makes wrong
    -- checkpoints, which fail.
    frontier          bytea NOT NULL CHECK (length(frontier) % 32 = 0),
    PRIMARY KEY (site_id, seq),
    -- One successor per checkpoint, one first checkpoint per site.
    UNIQUE NULLS NOT DISTINCT (site_id, prev_sha256)
);
SELECT querylayer.isolate_by_site('querylayer.ledger_checkpoints'::regclass);
SELECT querylayer.make_append_only('querylayer.ledger_checkpoints'::regclass);

-- A checkpoint as witnesses store it (ledger/src/checkpoint.rs).
CREATE FUNCTION querylayer.checkpoint_json(p querylayer.ledger_checkpoints) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN jsonb_build_object(
        'format', 'querylayer-checkpoint-v1', 'site_id', p.site_id, 'seq', p.seq,
        'head_sha256', encode(p.head_sha256, 'hex'), 'tree_root', encode(p.tree_root, 'hex'),
        'checkpointed_at', querylayer.utc_text(p.checkpointed_at),
        'prev_checkpoint_sha256', encode(p.prev_sha256, 'hex'),
        'key', (SELECT k.did_key FROM querylayer.server_keys k WHERE k.id = p.server_key_id),
        'signature', p.signature);
END
$$;

-- The records of a site with chain_seq in ($2, $3] ($1 the site), from every chained table:
-- table, id, chain columns, form, canonical form (the text content_sha256 hashes; NULL for an
-- unknown form) and time. Run with TimeZone UTC.
CREATE FUNCTION querylayer.ledger_records_sql() RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT string_agg(format(
                 'SELECT %L::text AS tbl, t.id::text AS id, t.chain_seq, t.ledger_form, t.prev_sha256, t.content_sha256,
                         t.record_sha256, (x.j - ARRAY(SELECT k FROM pg_catalog.jsonb_object_keys(x.j) AS k
                                                       WHERE NOT (k = ANY (f.fields))))::text AS canonical,
                         coalesce(x.j->>''created_at'', x.j->>''started_at'', x.j->>''imported_at'', x.j->>''staged_at'',
                                  x.j->>''decided_at'', x.j->>''executed_at'', x.j->>''recorded_at'')::timestamptz AS recorded
                    FROM %s t CROSS JOIN LATERAL (SELECT to_jsonb(t) AS j) x
                    LEFT JOIN querylayer.ledger_forms f ON f.table_name = %L AND f.form = t.ledger_form
                   WHERE t.site_id = $1 AND t.chain_seq > $2 AND t.chain_seq <= $3', table_name, table_name, table_name),
               ' UNION ALL ' ORDER BY table_name)
          FROM querylayer.ledger_tables);
END
$$;

-- Makes the site's next checkpoint, when its chain grew since the last one. Checks every record
-- since that checkpoint first (canonical form, content hash, link, sequence): a broken ledger is
-- never signed. Returns the site's newest checkpoint (NULL while its chain is empty).
CREATE FUNCTION querylayer.make_checkpoint(p_site uuid) RETURNS querylayer.ledger_checkpoints
LANGUAGE plpgsql
SET "TimeZone" = 'UTC' SET "IntervalStyle" = 'postgres' SET bytea_output = 'hex' SET extra_float_digits = 1 AS $$
DECLARE
    v_head     querylayer.ledger_heads;
    v_last     querylayer.ledger_checkpoints;
    v_key      querylayer.server_keys := querylayer.server_key();
    v_frontier bytea := ''::bytea;
    v_folded   bigint := 0;
    v_size     bigint := 0;
    v_prev     bytea := querylayer.ledger_genesis(p_site);
    v_leaves   bytea[] := '{}';
    v_problem  text;
    v_signed   jsonb;
    v_new      querylayer.ledger_checkpoints;
    r          record;
BEGIN
    -- One checkpoint of a site at a time; writers of the site are not held up (while this holds
    -- the head, they leave their records pending for the next seal).
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('querylayer.ledger_checkpoints:' || p_site::text, 0));
    -- Nothing committed is left out: what waits to be sealed is sealed first.
    PERFORM querylayer.seal_site(p_site);
    SELECT * INTO v_head FROM querylayer.ledger_heads WHERE site_id = p_site;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'site % has no ledger', p_site USING ERRCODE = 'QL404';
    END IF;
    SELECT * INTO v_last FROM querylayer.ledger_checkpoints WHERE site_id = p_site ORDER BY seq DESC LIMIT 1;
    IF v_last.seq IS NOT NULL THEN
        IF v_last.seq > v_head.seq THEN
            RAISE EXCEPTION 'the ledger of site % holds % records, but its checkpoint of % says %', p_site, v_head.seq,
                querylayer.utc_text(v_last.checkpointed_at), v_last.seq
                USING ERRCODE = 'QLL09', HINT = 'records were removed: run querylayer ledger verify against the witnesses';
        END IF;
        IF v_last.seq = v_head.seq THEN
            RETURN v_last;
        END IF;
        v_frontier := v_last.frontier;
        v_folded := v_last.seq;
        v_size := v_last.seq;
        v_prev := v_last.head_sha256;
    ELSIF v_head.seq = 0 THEN
        RETURN NULL;
    END IF;
    FOR r IN EXECUTE querylayer.ledger_records_sql() || ' ORDER BY chain_seq' USING p_site, v_size, v_head.seq LOOP
        v_problem := CASE
            WHEN r.chain_seq <> v_size + 1 THEN format('record %s is missing or out of order', v_size + 1)
            WHEN r.prev_sha256 IS DISTINCT FROM v_prev THEN 'prev_sha256 does not match the previous record'
            WHEN r.canonical IS NULL THEN format('unknown ledger form %s', r.ledger_form)
            WHEN pg_catalog.sha256(pg_catalog.convert_to(r.canonical, 'UTF8')) IS DISTINCT FROM r.content_sha256
                THEN 'content does not match content_sha256 (record edited)'
            WHEN pg_catalog.sha256(v_prev || r.content_sha256) IS DISTINCT FROM r.record_sha256 THEN 'record_sha256 does not match'
        END;
        IF v_problem IS NOT NULL THEN
            RAISE EXCEPTION 'site %: record % (% %): %; no checkpoint is signed over a broken ledger', p_site,
                coalesce(r.chain_seq::text, '?'), r.tbl, r.id, v_problem
                USING ERRCODE = 'QLL09', HINT = 'run querylayer ledger verify against the witnesses to see what changed';
        END IF;
        v_leaves := v_leaves || querylayer.ledger_leaf(r.chain_seq, r.tbl, r.ledger_form, r.content_sha256);
        v_size := r.chain_seq;
        v_prev := r.record_sha256;
        IF cardinality(v_leaves) >= 10000 THEN
            v_frontier := querylayer.ledger_extend(v_frontier, v_folded, (SELECT string_agg(x, ''::bytea ORDER BY o) FROM unnest(v_leaves) WITH ORDINALITY AS u(x, o)));
            v_folded := v_size;
            v_leaves := '{}';
        END IF;
    END LOOP;
    IF cardinality(v_leaves) > 0 THEN
        v_frontier := querylayer.ledger_extend(v_frontier, v_folded, (SELECT string_agg(x, ''::bytea ORDER BY o) FROM unnest(v_leaves) WITH ORDINALITY AS u(x, o)));
    END IF;
    IF v_size <> v_head.seq OR v_prev IS DISTINCT FROM v_head.head THEN
        RAISE EXCEPTION 'site %: the ledger head says % records, but records after % are missing', p_site, v_head.seq, v_size
            USING ERRCODE = 'QLL09', HINT = 'run querylayer ledger verify against the witnesses to see what changed';
    END IF;
    v_new.site_id := p_site;
    v_new.seq := v_size;
    v_new.head_sha256 := v_prev;
    v_new.tree_root := querylayer.ledger_tree_root(v_frontier, v_size);
    v_new.checkpointed_at := date_trunc('microseconds', clock_timestamp());
    v_new.prev_sha256 := v_last.checkpoint_sha256;
    v_new.server_key_id := v_key.id;
    v_new.frontier := v_frontier;
    v_signed := querylayer.ledger_sign_checkpoint(p_site, v_size, v_prev, v_new.tree_root, querylayer.utc_text(v_new.checkpointed_at),
                                                  v_new.prev_sha256, v_key.secret);
    v_new.signature := v_signed->>'signature';
    v_new.checkpoint_sha256 := decode(v_signed->>'checkpoint_sha256', 'hex');
    INSERT INTO querylayer.ledger_checkpoints SELECT v_new.*;
    RETURN v_new;
END
$$;

-- -------------------------------------------------------------------------------------------
-- The callable surface: operators (querylayer ledger …) and the worker.

-- Checkpoints one site (p_site) or every site whose chain grew since its last checkpoint.
-- Returns [{site, site_id, created, checkpoint}] (checkpoint NULL for an empty chain).
CREATE FUNCTION querylayer_api.create_checkpoints(p_site text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s       querylayer.sites;
    v_last  bigint;
    v       querylayer.ledger_checkpoints;
    v_out   jsonb := '[]';
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    IF p_site IS NOT NULL THEN
        PERFORM querylayer.site_by_slug(p_site);
    END IF;
    FOR s IN SELECT * FROM querylayer.sites WHERE p_site IS NULL OR slug = p_site ORDER BY slug LOOP
        PERFORM querylayer.enter_operator(s.id);
        SELECT max(seq) INTO v_last FROM querylayer.ledger_checkpoints WHERE site_id = s.id;
        v := querylayer.make_checkpoint(s.id);
        IF v.seq IS DISTINCT FROM v_last THEN
            PERFORM querylayer.audit('ledger.checkpoint'::text, s.id::text, jsonb_build_object('seq', v.seq));
        END IF;
        v_out := v_out || jsonb_build_object('site', s.slug, 'site_id', s.id, 'created', v.seq IS DISTINCT FROM v_last,
                                             'checkpoint', CASE WHEN v.seq IS NOT NULL THEN querylayer.checkpoint_json(v) END);
    END LOOP;
    RETURN v_out;
END
$$;

-- Seals what waits to be sealed: the committed pending records of one site (p_site) or of every
-- site that has any, each site's in the order they were written (docs/ledger.md, "Writers of one
-- site"). The worker calls it every few seconds; a checkpoint seals first by itself. Returns
-- [{site, site_id, sealed}] for the sites it sealed.
CREATE FUNCTION querylayer_api.seal_ledger(p_site text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s     querylayer.sites;
    v_n   bigint;
    v_out jsonb := '[]';
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    IF p_site IS NOT NULL THEN
        PERFORM querylayer.site_by_slug(p_site);
    END IF;
    FOR s IN SELECT * FROM querylayer.sites x
              WHERE (p_site IS NULL OR x.slug = p_site)
                AND EXISTS (SELECT 1 FROM querylayer.ledger_pending p WHERE p.site_id = x.id)
              ORDER BY x.slug LOOP
        PERFORM querylayer.enter_operator(s.id);
        v_n := querylayer.seal_site(s.id);
        v_out := v_out || jsonb_build_object('site', s.slug, 'site_id', s.id, 'sealed', v_n);
    END LOOP;
    RETURN v_out;
END
$$;

-- The sites and the newest checkpoint of each (for the witnesses to catch up from).
CREATE FUNCTION querylayer_api.ledger_sites() RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s     querylayer.sites;
    v_out jsonb := '[]';
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    FOR s IN SELECT * FROM querylayer.sites ORDER BY slug LOOP
        PERFORM querylayer.enter_operator(s.id);
        v_out := v_out || jsonb_build_object('site', s.slug, 'site_id', s.id,
            'records', (SELECT h.seq FROM querylayer.ledger_heads h WHERE h.site_id = s.id),
            'pending', (SELECT count(*) FROM querylayer.ledger_pending p WHERE p.site_id = s.id),
            'checkpoint_seq', (SELECT max(c.seq) FROM querylayer.ledger_checkpoints c WHERE c.site_id = s.id));
    END LOOP;
    RETURN v_out;
END
$$;

-- Whether a site's live pointers and topical map equal the replay of its state events, in the
-- database: {ok, problem}. (querylayer ledger verify checks the same outside it.)
CREATE FUNCTION querylayer_api.verify_live_state(p_site text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site    querylayer.sites;
    v_problem jsonb;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    v_problem := querylayer.live_state_problem(v_site.id);
    RETURN jsonb_build_object('ok', v_problem IS NULL, 'problem', v_problem);
END
$$;

-- A site's checkpoints after sequence number p_after_seq, oldest first (at most p_limit).
CREATE FUNCTION querylayer_api.ledger_checkpoints(p_site text, p_after_seq bigint DEFAULT 0, p_limit integer DEFAULT 1000)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    RETURN (SELECT coalesce(jsonb_agg(querylayer.checkpoint_json(c) ORDER BY c.seq), '[]')
              FROM (SELECT * FROM querylayer.ledger_checkpoints
                     WHERE site_id = v_site.id AND seq > coalesce(p_after_seq, 0)
                     ORDER BY seq LIMIT greatest(1, least(coalesce(p_limit, 1000), 10000))) c);
END
$$;

-- The leaf hashes (32 bytes each, concatenated) of a site's records p_after_seq + 1 ..
-- p_upto_seq, from their recorded content hashes: what witnesses keep beside each checkpoint.
CREATE FUNCTION querylayer_api.ledger_leaves(p_site text, p_after_seq bigint, p_upto_seq bigint) RETURNS bytea
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
    v_sql  text;
    v      bytea;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    SELECT 'SELECT coalesce(string_agg(querylayer.ledger_leaf(chain_seq, tbl, ledger_form, content_sha256), ''''::bytea ORDER BY chain_seq), ''''::bytea) FROM ('
           || string_agg(format('SELECT %L::text AS tbl, chain_seq, ledger_form, content_sha256 FROM %s WHERE site_id = $1 AND chain_seq > $2 AND chain_seq <= $3',
                                table_name, table_name), ' UNION ALL ') || ') r'
      INTO v_sql FROM querylayer.ledger_tables;
    EXECUTE v_sql INTO v USING v_site.id, coalesce(p_after_seq, 0), p_upto_seq;
    RETURN v;
END
$$;

-- One record by id, on whichever site holds it: {site, site_id, table, id, seq, form, canonical}.
CREATE FUNCTION querylayer_api.ledger_record(p_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET "TimeZone" = 'UTC' SET "IntervalStyle" = 'postgres' SET bytea_output = 'hex'
SET extra_float_digits = 1 AS $$
DECLARE
    s querylayer.sites;
    r record;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    FOR s IN SELECT * FROM querylayer.sites ORDER BY slug LOOP
        PERFORM querylayer.enter_operator(s.id);
        FOR r IN EXECUTE 'SELECT * FROM (' || replace(querylayer.ledger_records_sql(), 't.chain_seq > $2 AND t.chain_seq <= $3', 't.id = $2')
                         || ') x' USING s.id, p_id LOOP
            RETURN jsonb_build_object('site', s.slug, 'site_id', s.id, 'table', r.tbl, 'id', r.id, 'seq', r.chain_seq,
                                      'form', r.ledger_form, 'canonical', r.canonical);
        END LOOP;
    END LOOP;
    RAISE EXCEPTION 'no chained record %', p_id USING ERRCODE = 'QL404';
END
$$;

-- A site's records with chain_seq <= p_upto_seq whose time (created_at, started_at, …) is in
-- [p_from, p_to), in chain order: {table, id, seq, form, canonical, recorded_at}.
CREATE FUNCTION querylayer_api.ledger_records(p_site text, p_upto_seq bigint, p_from timestamptz DEFAULT NULL,
                                              p_to timestamptz DEFAULT NULL) RETURNS SETOF jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET "TimeZone" = 'UTC' SET "IntervalStyle" = 'postgres' SET bytea_output = 'hex'
SET extra_float_digits = 1 AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    RETURN QUERY EXECUTE
        'SELECT jsonb_build_object(''table'', tbl, ''id'', id, ''seq'', chain_seq, ''form'', ledger_form,
                                   ''canonical'', canonical, ''recorded_at'', querylayer.utc_text(recorded))
           FROM (' || querylayer.ledger_records_sql() || ') r
          WHERE ($4::timestamptz IS NULL OR recorded >= $4) AND ($5::timestamptz IS NULL OR recorded < $5)
          ORDER BY chain_seq'
        USING v_site.id, 0::bigint, p_upto_seq, p_from, p_to;
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.create_checkpoints, querylayer_api.ledger_sites, querylayer_api.ledger_checkpoints,
    querylayer_api.ledger_leaves, querylayer_api.seal_ledger TO querylayer_worker;
