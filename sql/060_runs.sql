-- Governed runs. Every material agent workflow: begin (type, structured input, required output
-- keys, completion conditions) -> immutable artifacts -> exactly one terminal outcome. Runs,
-- run_events and run_artifacts are append-only and chained; a run's state is derived from its
-- events, never stored in a mutable column.

CREATE TABLE querylayer.runs (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id               uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id       uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    agent_id              uuid NOT NULL REFERENCES querylayer.agents ON DELETE RESTRICT,
    connection_id         uuid NOT NULL REFERENCES querylayer.connections ON DELETE RESTRICT,
    harness               text NOT NULL,
    run_type              text NOT NULL CHECK (length(run_type) <= 80 AND run_type ~ '^[a-z][a-z0-9_.:-]*$'),
    input                 jsonb NOT NULL CHECK (jsonb_typeof(input) = 'object'),
    required_outputs      text[] NOT NULL DEFAULT '{}',
    completion_conditions text[] NOT NULL DEFAULT '{}',
    started_at            timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX runs_site_started ON querylayer.runs (site_id, started_at DESC);
SELECT querylayer.isolate_by_site('querylayer.runs'::regclass);
SELECT querylayer.make_chained('querylayer.runs'::regclass);
-- Columns of a chained table are added after make_chained, each followed by the canonical form
-- it opens, exactly as the upgrade adds them (docs/operations.md, "Schema changes").
-- 0.2.0, form 2 of runs: the extension version that recorded the run (NULL for earlier runs).
ALTER TABLE querylayer.runs ADD COLUMN extension_version text;
ALTER TABLE querylayer.runs ALTER COLUMN extension_version SET DEFAULT querylayer.installed_version();
SELECT querylayer.add_ledger_form('querylayer.runs'::regclass);

CREATE TABLE querylayer.run_events (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id           uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    run_id            uuid NOT NULL REFERENCES querylayer.runs ON DELETE RESTRICT,
    kind              text NOT NULL CHECK (kind IN ('started', 'finished')),
    agent_id          uuid NOT NULL,
    connection_id     uuid NOT NULL,
    harness           text NOT NULL,
    outcome           text CHECK (outcome IN ('completed', 'completed_with_warnings', 'needs_human_input',
                                              'blocked', 'failed', 'cancelled')),
    requested_outcome text,
    reason_code       text,
    reasons           jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(reasons) = 'array'),
    missing_outputs   text[] NOT NULL DEFAULT '{}',
    summary           text,
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((kind = 'finished') = (outcome IS NOT NULL))
);
CREATE UNIQUE INDEX run_events_one_start ON querylayer.run_events (run_id) WHERE kind = 'started';
CREATE UNIQUE INDEX run_events_one_finish ON querylayer.run_events (run_id) WHERE kind = 'finished';
SELECT querylayer.isolate_by_site('querylayer.run_events'::regclass);
SELECT querylayer.make_chained('querylayer.run_events'::regclass);

CREATE TABLE querylayer.run_artifacts (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id          uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    run_id           uuid NOT NULL REFERENCES querylayer.runs ON DELETE RESTRICT,
    key              text NOT NULL CHECK (length(key) <= 128 AND key ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$'),
    value            jsonb NOT NULL,
    affected_objects jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(affected_objects) = 'array'),
    agent_id         uuid NOT NULL,
    connection_id    uuid NOT NULL,
    harness          text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (run_id, key)
);
SELECT querylayer.isolate_by_site('querylayer.run_artifacts'::regclass);
SELECT querylayer.make_chained('querylayer.run_artifacts'::regclass);

-- Every run ends. Its deadline is fixed at begin_run (deadline_seconds, at most the operator's
-- run_deadline_max_seconds, run_deadline_default_seconds when not given); the worker closes a
-- run still open past it as cancelled with reason deadline_exceeded. A deadline never moves.
CREATE TABLE querylayer.run_deadlines (
    run_id      uuid PRIMARY KEY REFERENCES querylayer.runs ON DELETE RESTRICT,
    site_id     uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    deadline_at timestamptz NOT NULL
);
CREATE INDEX run_deadlines_due ON querylayer.run_deadlines (site_id, deadline_at);
SELECT querylayer.isolate_by_site('querylayer.run_deadlines'::regclass);
SELECT querylayer.make_append_only('querylayer.run_deadlines'::regclass);

-- How far the worker has looked for overdue runs, per site (so that a pass reads only the
-- deadlines that fell due since the previous one).
CREATE TABLE querylayer.run_deadline_sweeps (
    site_id      uuid PRIMARY KEY REFERENCES querylayer.sites ON DELETE RESTRICT,
    swept_until  timestamptz NOT NULL
);
SELECT querylayer.isolate_by_site('querylayer.run_deadline_sweeps'::regclass);

-- The run rules, held by the tables themselves: a record belongs to its run's site and
-- connection, a finished run accepts nothing, and "completed" is impossible while a required
-- output is missing. The run row is locked so that a finish and an artifact cannot interleave.
CREATE FUNCTION querylayer.run_records_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_run     querylayer.runs;
    v_outcome text;
    v_missing text[];
BEGIN
    IF querylayer.restoring() THEN
        RETURN NEW;  -- a restore brings the row as it was dumped
    END IF;
    -- Records of one run serialize against its finish: artifacts share the run's lock, the
    -- finish takes it alone. (An advisory lock: no row is rewritten to take it.)
    -- (NEW.kind exists on run_events only, hence the nested test.)
    v_outcome := NULL;
    IF TG_TABLE_NAME = 'run_events' THEN
        v_outcome := NEW.kind;
    END IF;
    IF v_outcome = 'finished' THEN
        PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(NEW.run_id::text, 7));
    ELSE
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(pg_catalog.hashtextextended(NEW.run_id::text, 7));
    END IF;
    SELECT * INTO v_run FROM querylayer.runs WHERE id = NEW.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run %', NEW.run_id USING ERRCODE = 'QL404';
    END IF;
    IF NEW.site_id <> v_run.site_id THEN
        RAISE EXCEPTION 'run % belongs to another connection', NEW.run_id USING ERRCODE = 'QL403';
    END IF;
    IF v_outcome = 'finished' THEN
        PERFORM querylayer.check_run_closer(v_run, NEW.agent_id, NEW.connection_id, NEW.outcome);
    ELSIF NEW.connection_id <> v_run.connection_id THEN
        RAISE EXCEPTION 'run % belongs to another connection', NEW.run_id USING ERRCODE = 'QL403';
    END IF;
    IF TG_TABLE_NAME = 'run_events' THEN
        IF NEW.kind = 'started' THEN
            RETURN NEW;
        END IF;
    END IF;
    SELECT outcome INTO v_outcome FROM querylayer.run_events WHERE run_id = NEW.run_id AND kind = 'finished';
    IF FOUND THEN
        RAISE EXCEPTION 'run % is finished (%); it accepts nothing more', NEW.run_id, v_outcome
            USING ERRCODE = 'QL410', HINT = 'begin a new run';
    END IF;
    IF TG_TABLE_NAME = 'run_events' THEN
        IF NEW.outcome IN ('completed', 'completed_with_warnings') THEN
            v_missing := querylayer.missing_outputs(v_run);
            IF cardinality(v_missing) > 0 THEN
                RAISE EXCEPTION 'run % cannot complete: missing required outputs %', NEW.run_id, array_to_string(v_missing, ', ')
                    USING ERRCODE = 'QL422';
            END IF;
        END IF;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER aa_run_records_guard BEFORE INSERT ON querylayer.run_events
    FOR EACH ROW EXECUTE FUNCTION querylayer.run_records_guard();
ALTER TABLE querylayer.run_events ENABLE ALWAYS TRIGGER aa_run_records_guard;
CREATE TRIGGER aa_run_records_guard BEFORE INSERT ON querylayer.run_artifacts
    FOR EACH ROW EXECUTE FUNCTION querylayer.run_records_guard();
ALTER TABLE querylayer.run_artifacts ENABLE ALWAYS TRIGGER aa_run_records_guard;

-- Who may write a run's finished event. The run's own agent, through any of its connections on
-- the site (the event names that connection): a run outlives a revoked or expired connection.
-- An owner or admin of the site, an operator, or the worker (an operator context) may close it as
-- cancelled only, in the run's own agent's and connection's name (the reasons say who closed it).
-- Never another agent.
CREATE FUNCTION querylayer.check_run_closer(p_run querylayer.runs, p_agent uuid, p_connection uuid, p_outcome text)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF querylayer.ctx_kind() = 'connection' THEN
        IF querylayer.ctx_agent_id() IS DISTINCT FROM p_run.agent_id
           OR p_agent IS DISTINCT FROM p_run.agent_id
           OR p_connection IS DISTINCT FROM querylayer.ctx_connection_id() THEN
            RAISE EXCEPTION 'run % belongs to another agent', p_run.id USING ERRCODE = 'QL403';
        END IF;
        RETURN;
    END IF;
    IF querylayer.ctx_kind() = 'member' AND querylayer.ctx_member_role() NOT IN ('owner', 'admin') THEN
        RAISE EXCEPTION 'a member with role % may not close runs (requires owner or admin)', querylayer.ctx_member_role()
            USING ERRCODE = 'QL403';
    END IF;
    IF querylayer.ctx_kind() = 'member' OR querylayer.ctx_is_operator() THEN
        IF p_outcome IS DISTINCT FROM 'cancelled' OR p_agent IS DISTINCT FROM p_run.agent_id
           OR p_connection IS DISTINCT FROM p_run.connection_id THEN
            RAISE EXCEPTION 'run % can only be cancelled, in its own agent''s name, by anyone but its agent', p_run.id
                USING ERRCODE = 'QL403';
        END IF;
        RETURN;
    END IF;
    RAISE EXCEPTION 'no authenticated principal may close run % in this transaction', p_run.id USING ERRCODE = 'QL401';
END
$$;

CREATE FUNCTION querylayer.missing_outputs(p_run querylayer.runs) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT coalesce(array_agg(k ORDER BY k), '{}')
      FROM unnest(p_run.required_outputs) AS k
     WHERE NOT EXISTS (SELECT 1 FROM querylayer.run_artifacts a WHERE a.run_id = p_run.id AND a.key = k));
END
$$;

-- Affected content objects: [{"type": "...", "id": "..."}, ...].
CREATE FUNCTION querylayer.check_affected_objects(p_objects jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_bad jsonb;
BEGIN
    IF p_objects IS NULL THEN
        RETURN '[]';
    END IF;
    IF jsonb_typeof(p_objects) <> 'array' THEN
        RAISE EXCEPTION 'affected_objects must be an array of {"type", "id"} objects' USING ERRCODE = '22023';
    END IF;
    SELECT o INTO v_bad FROM jsonb_array_elements(p_objects) AS o
     WHERE jsonb_typeof(o) <> 'object' OR jsonb_typeof(o->'type') IS DISTINCT FROM 'string'
        OR jsonb_typeof(o->'id') IS DISTINCT FROM 'string'
     LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'affected_objects: each entry needs string "type" and "id"; got %', left(v_bad::text, 200)
            USING ERRCODE = '22023';
    END IF;
    RETURN p_objects;
END
$$;

CREATE FUNCTION querylayer.check_keys(p_keys text[], p_what text) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_bad text;
BEGIN
    SELECT k INTO v_bad FROM unnest(coalesce(p_keys, '{}')) AS k
     WHERE k IS NULL OR length(k) > 128 OR k !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '%: invalid key % (letters, digits and _.:/-, at most 128)', p_what, coalesce(quote_literal(v_bad), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    RETURN ARRAY(SELECT DISTINCT k FROM unnest(coalesce(p_keys, '{}')) AS k ORDER BY k);
END
$$;

-- A run as readers see it, given its finished event (NULL while it is open), its deadline and
-- its artifacts' keys: the shape of a single run (run_json, begin_run's answer); a page of a list
-- writes the same members in its query (run_json_list).
CREATE FUNCTION querylayer.run_json_of(p_run querylayer.runs, p_finished querylayer.run_events, p_deadline_at timestamptz,
                                       p_artifact_keys jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN jsonb_build_object(
        'run_id', p_run.id, 'run_type', p_run.run_type, 'harness', p_run.harness,
        'agent_id', p_run.agent_id, 'connection_id', p_run.connection_id,
        'input', p_run.input, 'required_outputs', to_jsonb(p_run.required_outputs),
        'completion_conditions', to_jsonb(p_run.completion_conditions),
        'started_at', p_run.started_at,
        'state', CASE WHEN p_finished.id IS NULL THEN 'open' ELSE 'finished' END,
        'outcome', p_finished.outcome, 'requested_outcome', p_finished.requested_outcome,
        'reason_code', p_finished.reason_code, 'reasons', p_finished.reasons,
        'missing_outputs', to_jsonb(p_finished.missing_outputs), 'summary', p_finished.summary,
        'finished_at', p_finished.created_at,
        'deadline_at', p_deadline_at,
        'artifact_keys', p_artifact_keys);
END
$$;

CREATE FUNCTION querylayer.run_json(p_run querylayer.runs) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT querylayer.run_json_of(p_run, f,
               (SELECT d.deadline_at FROM querylayer.run_deadlines d WHERE d.run_id = p_run.id),
               (SELECT coalesce(jsonb_agg(a.key ORDER BY a.key), '[]') FROM querylayer.run_artifacts a WHERE a.run_id = p_run.id))
      FROM (SELECT 1) AS one
      LEFT JOIN querylayer.run_events f ON f.run_id = p_run.id AND f.kind = 'finished');
END
$$;

-- The runs p_ids in that order, each with its agent's handle, as a JSON array: a page of a list
-- in one query, not three an item. It writes run_json_of's members out in the query, with the
-- agent's handle among them, rather than calling it for each run and adding the handle to its
-- answer (a call of a PL/pgSQL function and a second building of the object a run were a sixth
-- of a page of ten: docs/performance.md, "0.12.0"). pg_tests/runs.rs holds every member of every
-- run of a page, open and finished, equal to what get_run gives for it.
CREATE FUNCTION querylayer.run_json_list(p_ids uuid[]) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'run_id', r.id, 'run_type', r.run_type, 'harness', r.harness,
               'agent_id', r.agent_id, 'connection_id', r.connection_id,
               'input', r.input, 'required_outputs', to_jsonb(r.required_outputs),
               'completion_conditions', to_jsonb(r.completion_conditions),
               'started_at', r.started_at,
               'state', CASE WHEN f.id IS NULL THEN 'open' ELSE 'finished' END,
               'outcome', f.outcome, 'requested_outcome', f.requested_outcome,
               'reason_code', f.reason_code, 'reasons', f.reasons,
               'missing_outputs', to_jsonb(f.missing_outputs), 'summary', f.summary,
               'finished_at', f.created_at,
               'deadline_at', d.deadline_at,
               'artifact_keys', coalesce(k.keys, '[]'),
               'agent', g.handle) ORDER BY x.o), '[]')
      FROM unnest(p_ids) WITH ORDINALITY AS x(id, o)
      JOIN querylayer.runs r ON r.id = x.id
      JOIN querylayer.agents g ON g.id = r.agent_id
      LEFT JOIN querylayer.run_events f ON f.run_id = r.id AND f.kind = 'finished'
      LEFT JOIN querylayer.run_deadlines d ON d.run_id = r.id
      LEFT JOIN LATERAL (SELECT jsonb_agg(a.key ORDER BY a.key) AS keys
                           FROM querylayer.run_artifacts a WHERE a.run_id = r.id) k ON true);
END
$$;

-- -------------------------------------------------------------------------------------------
-- The callable surface.

CREATE FUNCTION querylayer_api.begin_run(
    p_run_type text,
    p_input jsonb DEFAULT '{}',
    p_required_outputs text[] DEFAULT '{}',
    p_completion_conditions text[] DEFAULT '{}',
    p_deadline_seconds integer DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run      querylayer.runs;
    v_max      integer;
    v_deadline integer;
    v_deadline_at timestamptz;
BEGIN
    PERFORM querylayer.require_connection('runs:write'::text);
    -- Both deadline settings in one read (querylayer.setting_int's reading, twice over).
    SELECT max((value #>> '{}')::integer) FILTER (WHERE key = 'run_deadline_max_seconds'),
           coalesce(p_deadline_seconds, max((value #>> '{}')::integer) FILTER (WHERE key = 'run_deadline_default_seconds'))
      INTO v_max, v_deadline
      FROM querylayer.settings WHERE key IN ('run_deadline_max_seconds', 'run_deadline_default_seconds');
    IF v_deadline IS NULL OR v_deadline NOT BETWEEN 1 AND v_max THEN
        RAISE EXCEPTION 'deadline_seconds must be between 1 and % (the operator''s run_deadline_max_seconds); got %',
            v_max, coalesce(p_deadline_seconds::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_run_type IS NULL OR length(p_run_type) > 80 OR p_run_type !~ '^[a-z][a-z0-9_.:-]*$' THEN
        RAISE EXCEPTION 'run_type must be a stable identifier (lowercase, digits and _.:-, at most 80); got %',
            coalesce(quote_literal(p_run_type), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_input IS NULL OR jsonb_typeof(p_input) <> 'object' THEN
        RAISE EXCEPTION 'input must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(coalesce(p_completion_conditions, '{}')) c WHERE c IS NULL OR length(c) NOT BETWEEN 1 AND 2000) THEN
        RAISE EXCEPTION 'completion_conditions must be non-empty sentences of at most 2000 characters' USING ERRCODE = '22023';
    END IF;
    INSERT INTO querylayer.runs (site_id, organization_id, agent_id, connection_id, harness, run_type, input,
                                 required_outputs, completion_conditions)
    VALUES (querylayer.ctx_site_id(), querylayer.ctx_organization_id(), querylayer.ctx_agent_id(),
            querylayer.ctx_connection_id(), querylayer.ctx_harness(), p_run_type, p_input,
            querylayer.check_keys(p_required_outputs, 'required_outputs'::text),
            coalesce(p_completion_conditions, '{}'))
    RETURNING * INTO v_run;
    INSERT INTO querylayer.run_events (site_id, run_id, kind, agent_id, connection_id, harness)
    VALUES (v_run.site_id, v_run.id, 'started', v_run.agent_id, v_run.connection_id, v_run.harness);
    INSERT INTO querylayer.run_deadlines (run_id, site_id, deadline_at)
    VALUES (v_run.id, v_run.site_id, v_run.started_at + make_interval(secs => v_deadline))
    RETURNING deadline_at INTO v_deadline_at;
    PERFORM querylayer.audit('run.begin'::text, v_run.id::text, jsonb_build_object('run_type', v_run.run_type));
    -- The answer from what this transaction holds: a run it has just begun has no finish and no
    -- artifact, and its deadline is the one written above (what run_json would read back).
    RETURN querylayer.run_json_of(v_run, NULL::querylayer.run_events, v_deadline_at, '[]'::jsonb);
END
$$;

CREATE FUNCTION querylayer_api.record_artifact(
    p_run_id uuid,
    p_key text,
    p_value jsonb,
    p_affected_objects jsonb DEFAULT '[]'
) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run querylayer.runs;
    v_art querylayer.run_artifacts;
BEGIN
    PERFORM querylayer.require_connection('runs:write'::text);
    SELECT * INTO v_run FROM querylayer.runs WHERE id = p_run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run % on this site', p_run_id USING ERRCODE = 'QL404';
    END IF;
    IF v_run.connection_id <> querylayer.ctx_connection_id() THEN
        RAISE EXCEPTION 'run % belongs to another connection', p_run_id USING ERRCODE = 'QL403';
    END IF;
    IF p_key IS NULL OR length(p_key) > 128 OR p_key !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' THEN
        RAISE EXCEPTION 'key: invalid key % (letters, digits and _.:/-, at most 128)', coalesce(quote_literal(p_key), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_value IS NULL THEN
        RAISE EXCEPTION 'an artifact needs a JSON value' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM querylayer.run_artifacts WHERE run_id = p_run_id AND key = p_key) THEN
        RAISE EXCEPTION 'artifact % was already recorded in run %; artifacts are immutable', p_key, p_run_id
            USING ERRCODE = 'QL409', HINT = 'record the new result under another key';
    END IF;
    INSERT INTO querylayer.run_artifacts (site_id, run_id, key, value, affected_objects, agent_id, connection_id, harness)
    VALUES (v_run.site_id, v_run.id, p_key, p_value,
            CASE WHEN p_affected_objects = '[]'::jsonb THEN p_affected_objects
                 ELSE querylayer.check_affected_objects(p_affected_objects) END,
            querylayer.ctx_agent_id(), querylayer.ctx_connection_id(), querylayer.ctx_harness())
    RETURNING * INTO v_art;
    PERFORM querylayer.audit('run.artifact'::text, v_run.id::text, jsonb_build_object('key', p_key));
    RETURN jsonb_build_object('run_id', v_art.run_id, 'artifact_id', v_art.id, 'key', v_art.key,
                              'recorded_at', v_art.created_at,
                              'record_sha256', encode(v_art.record_sha256, 'hex'));
END
$$;

CREATE FUNCTION querylayer_api.finish_run(
    p_run_id uuid,
    p_outcome text,
    p_summary text DEFAULT NULL,
    p_reasons jsonb DEFAULT '[]'
) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run     querylayer.runs;
    v_missing text[];
    v_outcome text := p_outcome;
    v_reason  text;
BEGIN
    PERFORM querylayer.require_connection('runs:write'::text);
    IF p_outcome IS NULL OR p_outcome NOT IN ('completed', 'completed_with_warnings', 'needs_human_input',
                                               'blocked', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'outcome must be one of completed, completed_with_warnings, needs_human_input, blocked, failed, cancelled; got %',
            coalesce(quote_literal(p_outcome), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_reasons IS NOT NULL AND jsonb_typeof(p_reasons) <> 'array' THEN
        RAISE EXCEPTION 'reasons must be a JSON array' USING ERRCODE = '22023';
    END IF;
    -- Lock first: the completion check and the finish must see the same artifacts.
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(p_run_id::text, 7));
    SELECT * INTO v_run FROM querylayer.runs WHERE id = p_run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run % on this site', p_run_id USING ERRCODE = 'QL404';
    END IF;
    -- Any connection of the run's own agent may finish it (one that began it may be gone).
    IF v_run.agent_id <> querylayer.ctx_agent_id() THEN
        RAISE EXCEPTION 'run % belongs to another agent', p_run_id USING ERRCODE = 'QL403';
    END IF;
    IF p_outcome IN ('completed', 'completed_with_warnings') THEN
        v_missing := querylayer.missing_outputs(v_run);
        IF cardinality(v_missing) > 0 THEN
            -- Polished prose cannot turn partial work into a successful run.
            v_outcome := 'blocked';
            v_reason := 'missing_required_outputs';
        END IF;
    END IF;
    INSERT INTO querylayer.run_events (site_id, run_id, kind, agent_id, connection_id, harness, outcome,
                                       requested_outcome, reason_code, reasons, missing_outputs, summary)
    VALUES (v_run.site_id, v_run.id, 'finished', querylayer.ctx_agent_id(), querylayer.ctx_connection_id(),
            querylayer.ctx_harness(), v_outcome, p_outcome, v_reason, coalesce(p_reasons, '[]'),
            coalesce(v_missing, '{}'), p_summary);
    PERFORM querylayer.audit('run.finish'::text, v_run.id::text,
        jsonb_build_object('outcome', v_outcome, 'requested_outcome', p_outcome, 'reason_code', v_reason));
    RETURN querylayer.run_json(v_run);
END
$$;

-- Closes an open run as cancelled on behalf of someone other than its agent: an owner or admin
-- (cancelled_by_member), an operator (cancelled_by_operator), the worker at the deadline
-- (deadline_exceeded). The finished event keeps the run's agent and connection and records in
-- its reasons who closed it and why; check_run_closer admits nobody else.
CREATE FUNCTION querylayer.close_run(p_run_id uuid, p_reason_code text, p_closed_by jsonb, p_message text)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_run     querylayer.runs;
    v_outcome text;
    v_reason  jsonb;
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(p_run_id::text, 7));
    SELECT * INTO v_run FROM querylayer.runs WHERE id = p_run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run % on this site', p_run_id USING ERRCODE = 'QL404';
    END IF;
    SELECT outcome INTO v_outcome FROM querylayer.run_events WHERE run_id = p_run_id AND kind = 'finished';
    IF FOUND THEN
        RAISE EXCEPTION 'run % is finished (%); there is nothing to cancel', p_run_id, v_outcome
            USING ERRCODE = 'QL410';
    END IF;
    v_reason := jsonb_build_object('code', p_reason_code, 'closed_by', p_closed_by);
    IF p_message IS NOT NULL THEN
        v_reason := v_reason || jsonb_build_object('message', p_message);
    END IF;
    INSERT INTO querylayer.run_events (site_id, run_id, kind, agent_id, connection_id, harness, outcome,
                                       requested_outcome, reason_code, reasons)
    VALUES (v_run.site_id, v_run.id, 'finished', v_run.agent_id, v_run.connection_id, v_run.harness,
            'cancelled', 'cancelled', p_reason_code, jsonb_build_array(v_reason));
    PERFORM querylayer.audit('run.close'::text, v_run.id::text,
        jsonb_build_object('reason_code', p_reason_code, 'closed_by', p_closed_by->>'kind'));
    RETURN querylayer.run_json(v_run);
END
$$;

-- An owner or admin cancels an open run from the console.
CREATE FUNCTION querylayer_api.console_cancel_run(p_run_id uuid, p_reason text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']);
    RETURN querylayer.close_run(p_run_id, 'cancelled_by_member'::text,
        jsonb_build_object('kind', 'member', 'member_id', querylayer.ctx_member_id(), 'role', querylayer.ctx_member_role()),
        p_reason);
END
$$;

-- An operator cancels an open run (querylayer admin cancel-run).
CREATE FUNCTION querylayer_api.cancel_run(p_site text, p_run_id uuid, p_reason text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.enter_operator_site(p_site);
    RETURN querylayer.close_run(p_run_id, 'cancelled_by_operator'::text,
        jsonb_build_object('kind', 'operator', 'role', querylayer.outer_user()), p_reason);
END
$$;

-- The worker's pass: closes every open run whose deadline has passed, on every site (at most
-- p_limit per site and pass). Returns {"closed": n, "run_ids": [...]}.
CREATE FUNCTION querylayer_api.worker_close_expired_runs(p_limit integer DEFAULT 100) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site   uuid;
    v_from   timestamptz;
    v_now    timestamptz := pg_catalog.now();
    v_closed uuid[] := '{}';
    v_taken  integer;
    r        record;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'limit must be between 1 and 10000' USING ERRCODE = '22023';
    END IF;
    FOR v_site IN SELECT id FROM querylayer.sites ORDER BY id LOOP
        PERFORM querylayer.enter_operator(v_site);
        -- Deadlines are never in the past when written; an hour of overlap covers the
        -- transactions that were still open at the previous pass.
        SELECT swept_until - interval '1 hour' INTO v_from FROM querylayer.run_deadline_sweeps WHERE site_id = v_site;
        v_taken := 0;
        FOR r IN SELECT d.run_id, d.deadline_at FROM querylayer.run_deadlines d
                  WHERE d.site_id = v_site AND d.deadline_at <= v_now
                    AND (v_from IS NULL OR d.deadline_at > v_from)
                    AND NOT EXISTS (SELECT 1 FROM querylayer.run_events e WHERE e.run_id = d.run_id AND e.kind = 'finished')
                  ORDER BY d.deadline_at LIMIT p_limit LOOP
            BEGIN
                PERFORM querylayer.close_run(r.run_id, 'deadline_exceeded'::text,
                    jsonb_build_object('kind', 'worker', 'role', querylayer.outer_user(), 'deadline_at', r.deadline_at),
                    'the run passed its deadline while open'::text);
                v_closed := v_closed || r.run_id;
            EXCEPTION WHEN SQLSTATE 'QL410' THEN
                NULL;  -- finished meanwhile by its agent
            END;
            v_taken := v_taken + 1;
        END LOOP;
        IF v_taken < p_limit THEN
            INSERT INTO querylayer.run_deadline_sweeps (site_id, swept_until) VALUES (v_site, v_now)
            ON CONFLICT (site_id) DO UPDATE SET swept_until = EXCLUDED.swept_until;
        END IF;
    END LOOP;
    RETURN jsonb_build_object('closed', cardinality(v_closed), 'run_ids', to_jsonb(v_closed));
END
$$;

CREATE FUNCTION querylayer_api.get_run(p_run_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run querylayer.runs;
BEGIN
    PERFORM querylayer.require_principal('runs:read'::text);
    SELECT * INTO v_run FROM querylayer.runs WHERE id = p_run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run % on this site', p_run_id USING ERRCODE = 'QL404';
    END IF;
    RETURN querylayer.run_json(v_run) || jsonb_build_object(
        'events', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                        'event_id', e.id, 'kind', e.kind, 'outcome', e.outcome, 'reason_code', e.reason_code,
                        'at', e.created_at, 'record_sha256', encode(e.record_sha256, 'hex')) ORDER BY e.chain_seq, e.created_at), '[]')
                     FROM querylayer.run_events e WHERE e.run_id = p_run_id),
        'artifacts', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                        'artifact_id', a.id, 'key', a.key, 'value', a.value, 'affected_objects', a.affected_objects,
                        'recorded_at', a.created_at, 'record_sha256', encode(a.record_sha256, 'hex')) ORDER BY a.chain_seq, a.created_at), '[]')
                        FROM querylayer.run_artifacts a WHERE a.run_id = p_run_id));
END
$$;

-- One page of the site's runs, newest first, for the lists of runs (p_list names the list in its
-- cursors): filtered by status (`open`, or the outcome a run finished with), agent handle and
-- start time (p_since inclusive, p_until exclusive); each run with its agent's handle.
CREATE FUNCTION querylayer.runs_page(p_list text, p_limit integer, p_max integer, p_cursor text, p_status text,
                                     p_agent text, p_since timestamptz, p_until timestamptz) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_after record;
    v_ids   uuid[];
    v_keys  timestamptz[];
BEGIN
    IF p_status IS NOT NULL AND p_status NOT IN ('open', 'completed', 'completed_with_warnings', 'needs_human_input',
                                                  'blocked', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'a run''s status is open, completed, completed_with_warnings, needs_human_input, blocked, failed or cancelled; got %',
            quote_literal(p_status) USING ERRCODE = '22023';
    END IF;
    PERFORM querylayer.page_limit(p_limit, p_max);
    v_after := querylayer.page_after(p_list, p_cursor);
    SELECT array_agg(r.id ORDER BY r.started_at DESC, r.id DESC), array_agg(r.started_at ORDER BY r.started_at DESC, r.id DESC)
      INTO v_ids, v_keys
      FROM (SELECT x.id, x.started_at
              FROM querylayer.runs x JOIN querylayer.agents a ON a.id = x.agent_id
              LEFT JOIN querylayer.run_events f ON f.run_id = x.id AND f.kind = 'finished'
             WHERE x.site_id = querylayer.ctx_site_id()
               AND (p_agent IS NULL OR a.handle = p_agent)
               AND (p_since IS NULL OR x.started_at >= p_since)
               AND (p_until IS NULL OR x.started_at < p_until)
               AND (p_status IS NULL OR (p_status = 'open' AND f.id IS NULL) OR f.outcome = p_status)
               AND (v_after.after_id IS NULL
                    OR (x.started_at, x.id) < (v_after.after_key::timestamptz, v_after.after_id))
             ORDER BY x.started_at DESC, x.id DESC LIMIT p_limit + 1) r;
    RETURN jsonb_build_object('runs', querylayer.run_json_list(v_ids[1:p_limit]),
                              'next_cursor', querylayer.next_cursor(p_list, p_limit, coalesce(cardinality(v_ids), 0),
                                                                    querylayer.page_key(v_keys[p_limit]), v_ids[p_limit]));
END
$$;

-- The site's runs, newest first; a page of p_limit runs and the cursor of the next (p_before:
-- only runs that started before that instant; p_status: `open` or an outcome; p_agent: an agent's
-- handle). The MCP tool querylayer_list_runs.
CREATE FUNCTION querylayer_api.list_runs(p_limit integer DEFAULT 50, p_before timestamptz DEFAULT NULL,
                                         p_cursor text DEFAULT NULL, p_status text DEFAULT NULL,
                                         p_agent text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_principal('runs:read'::text);
    RETURN querylayer.runs_page('runs'::text, p_limit, 500, p_cursor, p_status, p_agent, NULL::timestamptz, p_before);
END
$$;

CREATE FUNCTION querylayer_api.site_context() RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    PERFORM querylayer.require_connection('site:read'::text);
    SELECT o.slug AS organization, o.name AS organization_name, s.slug AS site, s.name AS site_name,
           a.handle AS agent, a.kind AS agent_kind, a.profile_id, a.profile_name,
           c.name AS connection, c.prefix, c.expires_at, c.harness
      INTO r
      FROM querylayer.connections c
      JOIN querylayer.sites s ON s.id = c.site_id
      JOIN querylayer.organizations o ON o.id = c.organization_id
      JOIN querylayer.agents a ON a.id = c.agent_id
     WHERE c.id = querylayer.ctx_connection_id();
    RETURN jsonb_build_object(
        'organization', jsonb_build_object('slug', r.organization, 'name', r.organization_name),
        'site', jsonb_build_object('slug', r.site, 'name', r.site_name),
        'agent', jsonb_build_object('handle', r.agent, 'kind', r.agent_kind, 'profile_id', r.profile_id,
                                    'profile_name', r.profile_name),
        'connection', jsonb_build_object('name', r.connection, 'prefix', r.prefix, 'expires_at', r.expires_at,
                                         'harness', r.harness),
        'scopes', to_jsonb(querylayer.ctx_scopes()),
        -- What a draft may follow (querylayer_list_templates gives their fields).
        'templates', to_jsonb(querylayer.template_names(querylayer.ctx_site_id())));
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.begin_run, querylayer_api.record_artifact, querylayer_api.finish_run,
    querylayer_api.get_run, querylayer_api.list_runs, querylayer_api.site_context,
    querylayer_api.console_cancel_run TO querylayer_edge;
GRANT EXECUTE ON FUNCTION querylayer_api.worker_close_expired_runs TO querylayer_worker;
