-- Claim evidence and its re-verification. Agents attach evidence (source URL, quoted span,
-- retrieval time, content hash) to a claim in a draft revision: the item's current draft, while
-- it is not live (evidence supports a claim before a member decides on it, never after). Each evidence gets due
-- re-verification jobs; `querylayer worker` fetches the source, and the database decides what
-- the observation means, records the attempt, and opens one human review when the source
-- changed or vanished. Agents see only target, due-job, attempt-status and open-review
-- metadata: never observed bodies, excerpts, payloads or reviewer notes.

CREATE TABLE querylayer.claim_evidence (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    content_id     uuid NOT NULL REFERENCES querylayer.content_items ON DELETE RESTRICT,
    revision_id    uuid NOT NULL REFERENCES querylayer.content_revisions ON DELETE RESTRICT,
    claim          text NOT NULL CHECK (length(claim) BETWEEN 1 AND 2000),
    source_url     text NOT NULL CHECK (source_url ~ '^https?://[^[:space:]]+$'),
    quoted_span    text NOT NULL CHECK (length(quoted_span) BETWEEN 1 AND 4000),
    retrieved_at   timestamptz NOT NULL,
    source_sha256  text NOT NULL CHECK (source_sha256 ~ '^[0-9a-f]{64}$'),
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
SELECT querylayer.isolate_by_site('querylayer.claim_evidence'::regclass);
SELECT querylayer.make_attributed('querylayer.claim_evidence'::regclass);
SELECT querylayer.make_chained('querylayer.claim_evidence'::regclass);

CREATE TABLE querylayer.evidence_jobs (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id     uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    evidence_id uuid NOT NULL REFERENCES querylayer.claim_evidence ON DELETE RESTRICT,
    due_at      timestamptz NOT NULL,
    state       text NOT NULL DEFAULT 'due' CHECK (state IN ('due', 'running', 'done')),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    started_at  timestamptz,
    finished_at timestamptz
);
CREATE INDEX evidence_jobs_due ON querylayer.evidence_jobs (site_id, state, due_at);
-- At most one job waiting or running per evidence.
CREATE UNIQUE INDEX evidence_jobs_one_open ON querylayer.evidence_jobs (evidence_id) WHERE state <> 'done';
SELECT querylayer.isolate_by_site('querylayer.evidence_jobs'::regclass);

CREATE TABLE querylayer.evidence_attempts (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id          uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    job_id           uuid NOT NULL REFERENCES querylayer.evidence_jobs ON DELETE RESTRICT,
    evidence_id      uuid NOT NULL REFERENCES querylayer.claim_evidence ON DELETE RESTRICT,
    attempted_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    status           text NOT NULL CHECK (status IN ('unchanged', 'changed', 'vanished', 'error')),
    http_status      integer,
    -- What was observed stays here, for reviewers; no agent-facing function returns it.
    observed_sha256  text,
    observed_excerpt text
);
SELECT querylayer.isolate_by_site('querylayer.evidence_attempts'::regclass);
SELECT querylayer.make_append_only('querylayer.evidence_attempts'::regclass);

CREATE TABLE querylayer.evidence_reviews (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id       uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    evidence_id   uuid NOT NULL REFERENCES querylayer.claim_evidence ON DELETE RESTRICT,
    attempt_id    uuid NOT NULL REFERENCES querylayer.evidence_attempts ON DELETE RESTRICT,
    reason        text NOT NULL CHECK (reason IN ('changed', 'vanished')),
    state         text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed')),
    opened_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    closed_at     timestamptz,
    closed_by     uuid REFERENCES querylayer.members ON DELETE RESTRICT,
    reviewer_note text
);
CREATE UNIQUE INDEX evidence_reviews_one_open ON querylayer.evidence_reviews (evidence_id) WHERE state = 'open';
SELECT querylayer.isolate_by_site('querylayer.evidence_reviews'::regclass);

CREATE FUNCTION querylayer.schedule_evidence_job(p_evidence_id uuid, p_site_id uuid, p_due_at timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO querylayer.evidence_jobs (site_id, evidence_id, due_at) VALUES (p_site_id, p_evidence_id, p_due_at)
    ON CONFLICT DO NOTHING;
END
$$;

-- -------------------------------------------------------------------------------------------
-- Agent tools.

CREATE FUNCTION querylayer_api.record_claim_evidence(
    p_run_id uuid, p_revision_id uuid, p_claim text, p_source_url text, p_quoted_span text,
    p_retrieved_at timestamptz, p_source_sha256 text
) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rev  querylayer.content_revisions;
    v_item querylayer.content_items;
    v_ev   querylayer.claim_evidence;
BEGIN
    PERFORM querylayer.require_connection('content:write'::text);
    IF p_run_id IS NULL THEN
        RAISE EXCEPTION 'run_id is required: evidence is recorded inside an open run of the connection' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v_rev FROM querylayer.content_revisions WHERE id = p_revision_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'revision_id: no revision % on this site', p_revision_id USING ERRCODE = 'QL404';
    END IF;
    -- A draft revision: the item's current draft, not live. The item is locked so that a publish
    -- executing now cannot slip between this check and the insert.
    SELECT * INTO v_item FROM querylayer.content_items WHERE id = v_rev.content_id FOR SHARE;
    IF v_item.published_revision_id IS NOT DISTINCT FROM v_rev.id THEN
        RAISE EXCEPTION 'revision_id: revision % is live; evidence is recorded for claims in a draft revision', p_revision_id
            USING ERRCODE = 'QL422', HINT = 'write a new draft with querylayer_create_draft and record the evidence there';
    END IF;
    IF v_item.draft_revision_id IS DISTINCT FROM v_rev.id THEN
        RAISE EXCEPTION 'revision_id: revision % is no longer the draft of item % (the draft is %)', p_revision_id,
            v_item.id, v_item.draft_revision_id USING ERRCODE = 'QL422',
            HINT = 'record evidence for claims in the current draft';
    END IF;
    IF p_claim IS NULL OR length(p_claim) NOT BETWEEN 1 AND 2000 THEN
        RAISE EXCEPTION 'claim: 1 to 2000 characters are required' USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM jsonb_each(v_rev.fields) f, LATERAL (
                       SELECT CASE jsonb_typeof(f.value) WHEN 'string' THEN f.value #>> '{}' ELSE f.value::text END AS t) x
                    WHERE strpos(x.t, p_claim) > 0) THEN
        RAISE EXCEPTION 'claim: the text does not occur in revision %', p_revision_id USING ERRCODE = '22023',
            HINT = 'quote the claim exactly as the draft states it';
    END IF;
    IF p_source_url IS NULL OR p_source_url !~ '^https?://[^[:space:]]+$' THEN
        RAISE EXCEPTION 'source_url: an http(s) URL is required' USING ERRCODE = '22023';
    END IF;
    IF p_quoted_span IS NULL OR length(p_quoted_span) NOT BETWEEN 1 AND 4000 THEN
        RAISE EXCEPTION 'quoted_span: 1 to 4000 characters are required' USING ERRCODE = '22023';
    END IF;
    IF p_retrieved_at IS NULL OR p_retrieved_at > now() + interval '5 minutes' THEN
        RAISE EXCEPTION 'retrieved_at: a time that is not in the future is required' USING ERRCODE = '22023';
    END IF;
    IF p_source_sha256 IS NULL OR lower(p_source_sha256) !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'source_sha256: the SHA-256 of the source content, 64 hex characters, is required' USING ERRCODE = '22023';
    END IF;
    INSERT INTO querylayer.claim_evidence (site_id, content_id, revision_id, claim, source_url, quoted_span, retrieved_at,
                                           source_sha256, agent_id, connection_id, run_id)
    VALUES (v_rev.site_id, v_rev.content_id, v_rev.id, p_claim, p_source_url, p_quoted_span, p_retrieved_at,
            lower(p_source_sha256), querylayer.ctx_agent_id(), querylayer.ctx_connection_id(), p_run_id)
    RETURNING * INTO v_ev;
    PERFORM querylayer.schedule_evidence_job(v_ev.id, v_ev.site_id,
        now() + make_interval(days => querylayer.setting_int('evidence_reverify_after_days'::text)));
    PERFORM querylayer.audit('evidence.record'::text, v_ev.id::text, jsonb_build_object('revision_id', v_rev.id));
    RETURN jsonb_build_object('evidence_id', v_ev.id, 'revision_id', v_ev.revision_id, 'content_id', v_ev.content_id,
                              'claim', v_ev.claim, 'source_url', v_ev.source_url, 'retrieved_at', v_ev.retrieved_at,
                              'source_sha256', v_ev.source_sha256, 'record_sha256', encode(v_ev.record_sha256, 'hex'));
END
$$;

-- Oldest first; a page of p_limit and the cursor of the next.
CREATE FUNCTION querylayer_api.list_evidence(p_content_id uuid DEFAULT NULL, p_revision_id uuid DEFAULT NULL,
                                            p_limit integer DEFAULT 100, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.require_principal('content:read'::text);
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('evidence'::text, p_cursor);
    RETURN querylayer.page('evidence'::text, 'evidence'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', querylayer.page_key(e.created_at), 'id', e.id, 'item', jsonb_build_object(
                'evidence_id', e.id, 'content_id', e.content_id, 'revision_id', e.revision_id, 'claim', e.claim,
                'source_url', e.source_url, 'quoted_span', e.quoted_span, 'retrieved_at', e.retrieved_at,
                'source_sha256', e.source_sha256, 'run_id', e.run_id, 'created_at', e.created_at)) ORDER BY e.created_at, e.id)
          FROM (SELECT * FROM querylayer.claim_evidence x
                 WHERE x.site_id = querylayer.ctx_site_id()
                   AND (p_content_id IS NULL OR x.content_id = p_content_id)
                   AND (p_revision_id IS NULL OR x.revision_id = p_revision_id)
                   AND (v_after.after_id IS NULL
                        OR (x.created_at, x.id) > (v_after.after_key::timestamptz, v_after.after_id))
                 ORDER BY x.created_at, x.id LIMIT p_limit + 1) e));
END
$$;

-- Re-verification state, bounded to metadata: target, due job, last attempt status, open review.
-- Oldest evidence first; a page of p_limit and the cursor of the next.
CREATE FUNCTION querylayer_api.list_evidence_reverification(p_content_id uuid DEFAULT NULL, p_limit integer DEFAULT 100,
                                                           p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.require_principal('content:read'::text);
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('evidence_reverification'::text, p_cursor);
    RETURN querylayer.page('evidence_reverification'::text, 'evidence'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', querylayer.page_key(e.created_at), 'id', e.id, 'item', jsonb_build_object(
                'target', jsonb_build_object('evidence_id', e.id, 'content_id', e.content_id, 'revision_id', e.revision_id,
                                             'source_url', e.source_url),
                'due_job', (SELECT jsonb_build_object('job_id', j.id, 'due_at', j.due_at, 'state', j.state)
                              FROM querylayer.evidence_jobs j WHERE j.evidence_id = e.id AND j.state <> 'done'),
                'last_attempt', (SELECT jsonb_build_object('attempted_at', a.attempted_at, 'status', a.status)
                                   FROM querylayer.evidence_attempts a WHERE a.evidence_id = e.id
                                  ORDER BY a.attempted_at DESC LIMIT 1),
                'attempts', (SELECT count(*) FROM querylayer.evidence_attempts a WHERE a.evidence_id = e.id),
                'open_review', (SELECT jsonb_build_object('review_id', r.id, 'reason', r.reason, 'opened_at', r.opened_at)
                                  FROM querylayer.evidence_reviews r WHERE r.evidence_id = e.id AND r.state = 'open')))
               ORDER BY e.created_at, e.id)
          FROM (SELECT * FROM querylayer.claim_evidence x
                 WHERE x.site_id = querylayer.ctx_site_id() AND (p_content_id IS NULL OR x.content_id = p_content_id)
                   AND (v_after.after_id IS NULL
                        OR (x.created_at, x.id) > (v_after.after_key::timestamptz, v_after.after_id))
                 ORDER BY x.created_at, x.id LIMIT p_limit + 1) e));
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.record_claim_evidence, querylayer_api.list_evidence,
    querylayer_api.list_evidence_reverification TO querylayer_edge;

-- -------------------------------------------------------------------------------------------
-- The worker (querylayer_worker).

-- Takes up to p_limit due jobs across sites (SKIP LOCKED: several workers never take one job
-- twice) and returns what to fetch. The source hash stays here. A job still running 15 minutes
-- after it was taken belongs to a worker that died; it is taken again (otherwise its evidence,
-- which may have only one open job, would never be re-verified again).
CREATE FUNCTION querylayer_api.worker_claim_evidence_jobs(p_limit integer DEFAULT 20) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site uuid;
    v_out  jsonb := '[]';
    j      record;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    FOR v_site IN SELECT id FROM querylayer.sites ORDER BY id LOOP
        EXIT WHEN jsonb_array_length(v_out) >= p_limit;
        PERFORM querylayer.enter_operator(v_site);
        FOR j IN SELECT jb.id, jb.evidence_id, e.source_url
                   FROM querylayer.evidence_jobs jb JOIN querylayer.claim_evidence e ON e.id = jb.evidence_id
                  WHERE jb.site_id = v_site
                    AND ((jb.state = 'due' AND jb.due_at <= now())
                         OR (jb.state = 'running' AND jb.started_at < now() - interval '15 minutes'))
                  ORDER BY jb.due_at LIMIT p_limit - jsonb_array_length(v_out)
                    FOR UPDATE OF jb SKIP LOCKED LOOP
            UPDATE querylayer.evidence_jobs SET state = 'running', started_at = now() WHERE id = j.id;
            v_out := v_out || jsonb_build_object('job_id', j.id, 'evidence_id', j.evidence_id, 'source_url', j.source_url);
        END LOOP;
    END LOOP;
    RETURN v_out;
END
$$;

-- Records one fetch. The database decides: 404/410 → vanished; 2xx with the recorded hash →
-- unchanged; 2xx with another hash → changed; anything else → error (retried in an hour).
-- Changed or vanished opens a human review (one open review per evidence at most).
CREATE FUNCTION querylayer_api.worker_record_evidence_attempt(p_job_id uuid, p_http_status integer,
                                                              p_observed_sha256 text, p_observed_excerpt text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site    uuid;
    v_job     querylayer.evidence_jobs;
    v_ev      querylayer.claim_evidence;
    v_status  text;
    v_attempt uuid;
    v_review  uuid;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    FOR v_site IN SELECT id FROM querylayer.sites LOOP
        PERFORM querylayer.enter_operator(v_site);
        SELECT * INTO v_job FROM querylayer.evidence_jobs WHERE id = p_job_id FOR UPDATE;
        EXIT WHEN FOUND;
    END LOOP;
    IF v_job.id IS NULL THEN
        RAISE EXCEPTION 'no evidence job %', p_job_id USING ERRCODE = 'QL404';
    END IF;
    IF v_job.state <> 'running' THEN
        RAISE EXCEPTION 'evidence job % is %, not running', p_job_id, v_job.state USING ERRCODE = 'QL422';
    END IF;
    SELECT * INTO v_ev FROM querylayer.claim_evidence WHERE id = v_job.evidence_id;
    v_status := CASE
        WHEN p_http_status IN (404, 410) THEN 'vanished'
        WHEN p_http_status BETWEEN 200 AND 299 AND lower(p_observed_sha256) = v_ev.source_sha256 THEN 'unchanged'
        WHEN p_http_status BETWEEN 200 AND 299 AND p_observed_sha256 IS NOT NULL THEN 'changed'
        ELSE 'error' END;
    INSERT INTO querylayer.evidence_attempts (site_id, job_id, evidence_id, status, http_status, observed_sha256, observed_excerpt)
    VALUES (v_job.site_id, v_job.id, v_ev.id, v_status, p_http_status, lower(p_observed_sha256), left(p_observed_excerpt, 2000))
    RETURNING id INTO v_attempt;
    UPDATE querylayer.evidence_jobs SET state = 'done', finished_at = now() WHERE id = v_job.id;
    IF v_status IN ('changed', 'vanished') THEN
        INSERT INTO querylayer.evidence_reviews (site_id, evidence_id, attempt_id, reason)
        VALUES (v_job.site_id, v_ev.id, v_attempt, v_status)
        ON CONFLICT DO NOTHING
        RETURNING id INTO v_review;
    ELSIF v_status = 'unchanged' THEN
        PERFORM querylayer.schedule_evidence_job(v_ev.id, v_ev.site_id,
            now() + make_interval(days => querylayer.setting_int('evidence_reverify_after_days'::text)));
    ELSE
        PERFORM querylayer.schedule_evidence_job(v_ev.id, v_ev.site_id, now() + interval '1 hour');
    END IF;
    PERFORM querylayer.audit('evidence.attempt'::text, v_ev.id::text, jsonb_build_object('status', v_status, 'review_opened', v_review IS NOT NULL));
    RETURN jsonb_build_object('job_id', v_job.id, 'status', v_status, 'review_id', v_review);
END
$$;

-- A member closes a review with a note; re-verification resumes.
CREATE FUNCTION querylayer_api.console_close_evidence_review(p_review_id uuid, p_note text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v querylayer.evidence_reviews;
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin', 'editor']);
    UPDATE querylayer.evidence_reviews SET state = 'closed', closed_at = now(), closed_by = querylayer.ctx_member_id(),
           reviewer_note = p_note
     WHERE id = p_review_id AND state = 'open' RETURNING * INTO v;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no open evidence review % on this site', p_review_id USING ERRCODE = 'QL404';
    END IF;
    PERFORM querylayer.schedule_evidence_job(v.evidence_id, v.site_id,
        now() + make_interval(days => querylayer.setting_int('evidence_reverify_after_days'::text)));
    PERFORM querylayer.audit('evidence.review_close'::text, v.id::text, '{}'::jsonb);
    RETURN jsonb_build_object('review_id', v.id, 'state', v.state);
END
$$;

-- Reviews with what was observed: for members, never for agents.
CREATE FUNCTION querylayer_api.console_list_evidence_reviews(p_state text DEFAULT 'open', p_limit integer DEFAULT 50,
                                                            p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('evidence_reviews'::text, p_cursor);
    RETURN querylayer.page('evidence_reviews'::text, 'reviews'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', querylayer.page_key(r.opened_at), 'id', r.id, 'item', jsonb_build_object(
                'review_id', r.id, 'reason', r.reason, 'state', r.state, 'opened_at', r.opened_at,
                'evidence', jsonb_build_object('evidence_id', e.id, 'claim', e.claim, 'source_url', e.source_url,
                                               'quoted_span', e.quoted_span, 'source_sha256', e.source_sha256),
                'observed', jsonb_build_object('http_status', a.http_status, 'sha256', a.observed_sha256,
                                               'excerpt', a.observed_excerpt, 'attempted_at', a.attempted_at),
                'reviewer_note', r.reviewer_note)) ORDER BY r.opened_at, r.id)
          FROM (SELECT * FROM querylayer.evidence_reviews x
                 WHERE x.site_id = querylayer.ctx_site_id() AND (p_state IS NULL OR x.state = p_state)
                   AND (v_after.after_id IS NULL
                        OR (x.opened_at, x.id) > (v_after.after_key::timestamptz, v_after.after_id))
                 ORDER BY x.opened_at, x.id LIMIT p_limit + 1) r
          JOIN querylayer.claim_evidence e ON e.id = r.evidence_id
          JOIN querylayer.evidence_attempts a ON a.id = r.attempt_id));
END
$$;
-- Operators (and tests) may bring a job forward.
CREATE FUNCTION querylayer_api.make_evidence_jobs_due(p_site text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
    v_n    integer;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    UPDATE querylayer.evidence_jobs SET due_at = now() WHERE site_id = v_site.id AND state = 'due';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.console_close_evidence_review, querylayer_api.console_list_evidence_reviews
    TO querylayer_edge;
GRANT EXECUTE ON FUNCTION querylayer_api.worker_claim_evidence_jobs, querylayer_api.worker_record_evidence_attempt
    TO querylayer_worker;
