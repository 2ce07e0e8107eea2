-- The Agent Console and durable task plans (AGENT-003 orchestrates; AGENT-002 authorizes and
-- executes governed mutations). A member opens a conversation bound to one Hermes-owned stored
-- session under the agent's immutable profile_id, and adds turns. A harness (a connection of
-- that agent) claims a turn, turns a multi-step goal into a versioned task plan, and receives
-- one dependency-ready step at a time (docs/console.md). Missing or ambiguous identity, binding
-- or session state fails closed with the reason stored; nothing invents a profile or session.

-- Hermes-owned sessions QueryLayer knows of. QueryLayer never creates a Hermes session: the
-- console registers one that exists, and records when it ends or goes missing.
CREATE TABLE querylayer.agent_sessions (
    site_id       uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    session_id    text NOT NULL CHECK (session_id ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    agent_id      uuid NOT NULL REFERENCES querylayer.agents ON DELETE RESTRICT,
    profile_id    text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    registered_by uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    ended_at      timestamptz,
    ended_reason  text,
    PRIMARY KEY (site_id, session_id),
    -- A Hermes session belongs to its profile (the deep link names both, and Hermes verifies the
    -- session under that profile), and a profile_id names one agent of one organization. So one
    -- stored session is registered once, on one site, across every site and organization.
    UNIQUE (profile_id, session_id)
);
SELECT querylayer.isolate_by_site('querylayer.agent_sessions'::regclass);

CREATE TABLE querylayer.console_conversations (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id    uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    agent_id   uuid NOT NULL REFERENCES querylayer.agents ON DELETE RESTRICT,
    profile_id text NOT NULL,
    session_id text NOT NULL,
    title      text NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
    opened_by  uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- One conversation, one Hermes session (registered on one site only: see agent_sessions).
    UNIQUE (site_id, session_id),
    UNIQUE (profile_id, session_id),
    FOREIGN KEY (site_id, session_id) REFERENCES querylayer.agent_sessions (site_id, session_id) ON DELETE RESTRICT
);
SELECT querylayer.isolate_by_site('querylayer.console_conversations'::regclass);
SELECT querylayer.make_append_only('querylayer.console_conversations'::regclass);

CREATE TABLE querylayer.console_turns (
    id                     uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id                uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    conversation_id        uuid NOT NULL REFERENCES querylayer.console_conversations ON DELETE RESTRICT,
    request                text NOT NULL CHECK (length(request) BETWEEN 1 AND 20000),
    created_by             uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    created_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    state                  text NOT NULL DEFAULT 'queued'
                           CHECK (state IN ('queued', 'claimed', 'completed', 'failed', 'cancelled')),
    claimed_connection_id  uuid REFERENCES querylayer.connections ON DELETE RESTRICT,
    claimed_session_id     text,
    claimed_at             timestamptz,
    ended_at               timestamptz,
    outcome                text,
    failure_reason         text,
    result                 jsonb,
    -- Automatic retries spent on this turn, across every step and plan version; a member's
    -- re-open restores them.
    retries_used           integer NOT NULL DEFAULT 0 CHECK (retries_used BETWEEN 0 AND 2)
);
CREATE INDEX console_turns_queue ON querylayer.console_turns (site_id, state, created_at);
SELECT querylayer.isolate_by_site('querylayer.console_turns'::regclass);

-- A turn moves forward only: queued → claimed → completed | failed; queued | claimed → cancelled
-- or failed (closed); failed | cancelled → queued only when a member re-opens it. Its request and
-- origin never change, and its retry budget only shrinks until a member re-opens it.
CREATE FUNCTION querylayer.console_turns_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'console turns are never deleted' USING ERRCODE = 'QL423';
    END IF;
    IF (NEW.id, NEW.site_id, NEW.conversation_id, NEW.request, NEW.created_by, NEW.created_at)
       IS DISTINCT FROM (OLD.id, OLD.site_id, OLD.conversation_id, OLD.request, OLD.created_by, OLD.created_at) THEN
        RAISE EXCEPTION 'a turn''s request is immutable' USING ERRCODE = 'QL423';
    END IF;
    IF OLD.state IN ('failed', 'cancelled') AND NEW.state = 'queued' THEN
        IF querylayer.ctx_kind() IS DISTINCT FROM 'member' THEN
            RAISE EXCEPTION 'only a member re-opens a % turn', OLD.state USING ERRCODE = 'QL403';
        END IF;
        RETURN NEW;
    END IF;
    IF NOT ((OLD.state = 'queued' AND NEW.state IN ('claimed', 'failed', 'cancelled'))
         OR (OLD.state = 'claimed' AND NEW.state IN ('completed', 'failed', 'cancelled'))
         OR (OLD.state = NEW.state AND OLD.state = 'claimed'
             AND NEW.claimed_connection_id IS NOT DISTINCT FROM OLD.claimed_connection_id)) THEN
        RAISE EXCEPTION 'a turn cannot go from % to %', OLD.state, NEW.state USING ERRCODE = 'QL422';
    END IF;
    IF NEW.retries_used < OLD.retries_used THEN
        RAISE EXCEPTION 'a turn''s retry budget is restored only when a member re-opens it' USING ERRCODE = 'QL423';
    END IF;
    IF OLD.state = 'claimed' AND NEW.claimed_connection_id IS DISTINCT FROM OLD.claimed_connection_id THEN
        RAISE EXCEPTION 'a claimed turn stays with its claimant' USING ERRCODE = 'QL423';
    END IF;
    RETURN NEW;
END
$$;
SELECT querylayer.guard_rows('querylayer.console_turns'::regclass, 'querylayer.console_turns_guard'::regproc, false);

-- Operation types of plan steps: server-assigned risk, the scope each needs, and the typed
-- AGENT-002 proposal a step must produce (and wait on) before it counts as done.
CREATE TABLE querylayer.task_operations (
    operation      text PRIMARY KEY,
    risk           text NOT NULL CHECK (risk IN ('low', 'medium', 'high')),
    required_scope text NOT NULL REFERENCES querylayer.scopes,
    proposal_type  text REFERENCES querylayer.proposal_types,
    description    text NOT NULL
);
INSERT INTO querylayer.task_operations (operation, risk, required_scope, proposal_type, description) VALUES
    ('research',       'low',    'content:read',      NULL,                'read content, briefs, evidence or the topical map'),
    ('analysis',       'low',    'runs:write',        NULL,                'record findings as run artifacts'),
    ('draft',          'medium', 'content:write',     NULL,                'create a draft revision (never published)'),
    ('create_content', 'medium', 'content:write',     'create_content',    'propose a new content item'),
    ('revision',       'medium', 'content:write',     'revision',          'propose a revision of an item'),
    ('topical_map',    'medium', 'topical-map:write', 'topical_map',       'propose topical map changes'),
    ('internal_link',  'low',    'content:write',     'internal_link',     'propose an internal link'),
    ('publish',        'high',   'publish:request',   'publish_lifecycle', 'request publishing or unpublishing'),
    ('archive',        'high',   'publish:request',   'content_lifecycle', 'request archiving or restoring');

-- Versions of a turn's plan. A new version supersedes the old one; neither is rewritten.
CREATE TABLE querylayer.task_plans (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    turn_id        uuid NOT NULL REFERENCES querylayer.console_turns ON DELETE RESTRICT,
    version        integer NOT NULL CHECK (version > 0),
    goal           text NOT NULL CHECK (length(goal) BETWEEN 1 AND 4000),
    agent_id       uuid NOT NULL REFERENCES querylayer.agents ON DELETE RESTRICT,
    profile_id     text NOT NULL,
    session_id     text NOT NULL,
    connection_id  uuid NOT NULL REFERENCES querylayer.connections ON DELETE RESTRICT,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    state          text NOT NULL DEFAULT 'active'
                   CHECK (state IN ('active', 'completed', 'failed', 'cancelled', 'superseded')),
    ended_at       timestamptz,
    failure_reason text,
    UNIQUE (turn_id, version)
);
SELECT querylayer.isolate_by_site('querylayer.task_plans'::regclass);

CREATE TABLE querylayer.task_steps (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    plan_id         uuid NOT NULL REFERENCES querylayer.task_plans ON DELETE RESTRICT,
    key             text NOT NULL CHECK (key ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    ordinal         integer NOT NULL,
    operation       text NOT NULL REFERENCES querylayer.task_operations ON DELETE RESTRICT,
    risk            text NOT NULL,
    depends_on      text[] NOT NULL DEFAULT '{}',
    instructions    text NOT NULL CHECK (length(instructions) BETWEEN 1 AND 4000),
    state           text NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'running', 'awaiting_approval', 'succeeded', 'failed',
                                     'cancelled', 'superseded')),
    retry_count     integer NOT NULL DEFAULT 0 CHECK (retry_count BETWEEN 0 AND 2),
    run_id          uuid REFERENCES querylayer.runs ON DELETE RESTRICT,
    proposal_id     uuid REFERENCES querylayer.proposals ON DELETE RESTRICT,
    result          jsonb,
    failure_reason  text,
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (plan_id, key),
    UNIQUE (plan_id, ordinal)
);
SELECT querylayer.isolate_by_site('querylayer.task_steps'::regclass);

-- The risk of a step is the server's, from its operation; the definition of a step never
-- changes after the plan version is created, only its progress does.
CREATE FUNCTION querylayer.task_steps_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NOT querylayer.restoring() THEN
            SELECT risk INTO NEW.risk FROM querylayer.task_operations WHERE operation = NEW.operation;
        END IF;
        RETURN NEW;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'plan steps are never deleted' USING ERRCODE = 'QL423';
    END IF;
    IF (NEW.id, NEW.site_id, NEW.plan_id, NEW.key, NEW.ordinal, NEW.operation, NEW.risk, NEW.depends_on, NEW.instructions)
       IS DISTINCT FROM (OLD.id, OLD.site_id, OLD.plan_id, OLD.key, OLD.ordinal, OLD.operation, OLD.risk, OLD.depends_on, OLD.instructions) THEN
        RAISE EXCEPTION 'a plan step''s definition is immutable; create a new plan version' USING ERRCODE = 'QL423';
    END IF;
    IF OLD.state IN ('succeeded', 'failed', 'cancelled', 'superseded') THEN
        RAISE EXCEPTION 'step % is already %', OLD.key, OLD.state USING ERRCODE = 'QL422';
    END IF;
    IF NEW.retry_count < OLD.retry_count THEN
        RAISE EXCEPTION 'retry counts only grow' USING ERRCODE = 'QL423';
    END IF;
    NEW.updated_at := clock_timestamp();
    RETURN NEW;
END
$$;
SELECT querylayer.guard_rows('querylayer.task_steps'::regclass, 'querylayer.task_steps_guard'::regproc, true);

-- A plan version starts only on a turn that its connection holds claimed: never on a turn that
-- failed, was cancelled or completed (the turn row is locked, so a member's cancel and a new
-- version cannot cross).
CREATE FUNCTION querylayer.task_plans_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- A restore brings plans as they were written, whatever their turn went on to become.
    IF TG_OP = 'INSERT' AND querylayer.restoring() THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' THEN
        PERFORM 1 FROM querylayer.console_turns t
          WHERE t.id = NEW.turn_id AND t.state = 'claimed' AND t.claimed_connection_id = NEW.connection_id
            FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'a plan starts only on a turn its connection holds claimed' USING ERRCODE = 'QL422',
                HINT = 'a failed or cancelled turn takes no new plan until a member re-opens it';
        END IF;
        RETURN NEW;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'task plans are never deleted' USING ERRCODE = 'QL423';
    END IF;
    IF (NEW.id, NEW.site_id, NEW.turn_id, NEW.version, NEW.goal, NEW.agent_id, NEW.profile_id, NEW.session_id,
        NEW.connection_id, NEW.created_at)
       IS DISTINCT FROM (OLD.id, OLD.site_id, OLD.turn_id, OLD.version, OLD.goal, OLD.agent_id, OLD.profile_id,
        OLD.session_id, OLD.connection_id, OLD.created_at) THEN
        RAISE EXCEPTION 'a plan version is immutable; create a new version' USING ERRCODE = 'QL423';
    END IF;
    IF OLD.state <> 'active' THEN
        RAISE EXCEPTION 'plan version % is already %', OLD.version, OLD.state USING ERRCODE = 'QL422';
    END IF;
    RETURN NEW;
END
$$;
SELECT querylayer.guard_rows('querylayer.task_plans'::regclass, 'querylayer.task_plans_guard'::regproc, true);

-- -------------------------------------------------------------------------------------------
-- Internals.

-- Why a conversation cannot be acted on now, or NULL: its profile must still resolve to exactly
-- its agent (by immutable id), and its Hermes session must be registered and not ended.
CREATE FUNCTION querylayer.conversation_problem(p_conv querylayer.console_conversations) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT CASE
        WHEN (SELECT count(*) FROM querylayer.agents a WHERE a.profile_id = p_conv.profile_id) = 0
            THEN format('profile %s is unknown', p_conv.profile_id)
        WHEN (SELECT count(*) FROM querylayer.agents a WHERE a.profile_id = p_conv.profile_id) > 1
            THEN format('profile %s is ambiguous', p_conv.profile_id)
        WHEN NOT EXISTS (SELECT 1 FROM querylayer.agents a WHERE a.profile_id = p_conv.profile_id AND a.id = p_conv.agent_id)
            THEN format('profile %s is no longer bound to the conversation''s agent', p_conv.profile_id)
        WHEN NOT EXISTS (SELECT 1 FROM querylayer.agent_sessions s
                          WHERE s.site_id = p_conv.site_id AND s.session_id = p_conv.session_id AND s.ended_at IS NULL)
            THEN format('session %s is missing or ended', p_conv.session_id)
    END);
END
$$;

CREATE FUNCTION querylayer.turn_json(p_turn_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT jsonb_build_object(
        'turn_id', t.id, 'conversation_id', t.conversation_id, 'request', t.request, 'state', t.state,
        'created_at', t.created_at, 'claimed_at', t.claimed_at, 'ended_at', t.ended_at, 'outcome', t.outcome,
        'failure_reason', t.failure_reason, 'result', t.result, 'retries_left', 2 - t.retries_used,
        'session_id', c.session_id, 'profile_id', c.profile_id, 'conversation_title', c.title)
      FROM querylayer.console_turns t JOIN querylayer.console_conversations c ON c.id = t.conversation_id
     WHERE t.id = p_turn_id);
END
$$;

CREATE FUNCTION querylayer.plan_json(p_plan_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT jsonb_build_object(
        'plan_id', p.id, 'turn_id', p.turn_id, 'version', p.version, 'goal', p.goal, 'state', p.state,
        'profile_id', p.profile_id, 'session_id', p.session_id, 'created_at', p.created_at,
        'failure_reason', p.failure_reason,
        'steps', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                      'step_id', s.id, 'key', s.key, 'operation', s.operation, 'risk', s.risk,
                      'depends_on', to_jsonb(s.depends_on), 'instructions', s.instructions, 'state', s.state,
                      'retry_count', s.retry_count, 'run_id', s.run_id, 'proposal_id', s.proposal_id,
                      'result', s.result, 'failure_reason', s.failure_reason) ORDER BY s.ordinal), '[]')
                    FROM querylayer.task_steps s WHERE s.plan_id = p.id))
      FROM querylayer.task_plans p WHERE p.id = p_plan_id);
END
$$;

-- Fails a turn closed (when it is still claimed), with its reason.
CREATE FUNCTION querylayer.fail_turn(p_turn_id uuid, p_reason text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE querylayer.console_turns SET state = 'failed', ended_at = now(), outcome = 'failed', failure_reason = p_reason
     WHERE id = p_turn_id AND state = 'claimed';
    IF FOUND THEN
        PERFORM querylayer.audit('turn.fail_closed'::text, p_turn_id::text, jsonb_build_object('reason', p_reason));
    END IF;
END
$$;

-- Fails a plan closed: the reason is stored, every step that has not finished is cancelled, and
-- the turn fails with it (the retry budget is the turn's: a new plan version cannot restore it;
-- a member may re-open the turn).
CREATE FUNCTION querylayer.fail_plan(p_plan_id uuid, p_reason text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_turn uuid;
BEGIN
    UPDATE querylayer.task_steps SET state = 'cancelled', failure_reason = coalesce(failure_reason, 'the plan failed: ' || p_reason)
     WHERE plan_id = p_plan_id AND state IN ('pending', 'running', 'awaiting_approval');
    UPDATE querylayer.task_plans SET state = 'failed', ended_at = now(), failure_reason = p_reason
     WHERE id = p_plan_id AND state = 'active'
    RETURNING turn_id INTO v_turn;
    IF v_turn IS NOT NULL THEN
        PERFORM querylayer.audit('plan.fail'::text, p_plan_id::text, jsonb_build_object('reason', p_reason));
        PERFORM querylayer.fail_turn(v_turn, p_reason);
    END IF;
END
$$;

-- Ends a turn on a member's word: the turn is cancelled with the reason, its active plan and
-- every unfinished step with it. Nothing more is accepted for it until a member re-opens it.
CREATE FUNCTION querylayer.cancel_turn(p_turn_id uuid, p_reason text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_plan querylayer.task_plans;
BEGIN
    v_plan := querylayer.current_plan(p_turn_id);
    IF v_plan.state = 'active' THEN
        UPDATE querylayer.task_steps SET state = 'cancelled', failure_reason = p_reason
         WHERE plan_id = v_plan.id AND state IN ('pending', 'running', 'awaiting_approval');
        UPDATE querylayer.task_plans SET state = 'cancelled', ended_at = now(), failure_reason = p_reason
         WHERE id = v_plan.id;
        PERFORM querylayer.audit('plan.cancel'::text, v_plan.id::text, jsonb_build_object('reason', p_reason));
    END IF;
    UPDATE querylayer.console_turns SET state = 'cancelled', ended_at = now(), outcome = 'cancelled', failure_reason = p_reason
     WHERE id = p_turn_id AND state IN ('queued', 'claimed');
    PERFORM querylayer.audit('turn.cancel'::text, p_turn_id::text, jsonb_build_object('reason', p_reason));
END
$$;

-- Why a claimed turn's task can no longer run, or NULL: the binding it was claimed under (the
-- connection: not revoked, not expired, its agent still holding runs:write on the site), the
-- conversation's profile and session, and (with p_steps) the scopes that the unfinished steps of
-- its active plan need. With the reason, the step that can never run, when one is to blame.
CREATE FUNCTION querylayer.task_binding_problem(p_turn querylayer.console_turns, p_steps boolean DEFAULT true,
                                                OUT reason text, OUT step_id uuid, OUT step_reason text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_conn  querylayer.connections;
    v_conv  querylayer.console_conversations;
    v_plan  querylayer.task_plans;
    v_step  record;
BEGIN
    SELECT * INTO v_conv FROM querylayer.console_conversations WHERE id = p_turn.conversation_id;
    reason := querylayer.conversation_problem(v_conv);
    IF reason IS NOT NULL OR p_turn.state <> 'claimed' THEN
        RETURN;
    END IF;
    SELECT * INTO v_conn FROM querylayer.connections WHERE id = p_turn.claimed_connection_id;
    reason := CASE
        WHEN v_conn.id IS NULL THEN 'the connection that claimed the turn is unknown'
        WHEN v_conn.revoked_at IS NOT NULL THEN
            format('connection %s was revoked%s', quote_literal(v_conn.name), coalesce(': ' || v_conn.revoked_reason, ''))
        WHEN v_conn.expires_at <= now() THEN
            format('connection %s expired at %s', quote_literal(v_conn.name), v_conn.expires_at)
        WHEN NOT EXISTS (SELECT 1 FROM querylayer.agent_site_permissions p
                          WHERE p.site_id = v_conn.site_id AND p.agent_id = v_conn.agent_id AND p.scope = 'runs:write')
             OR NOT 'runs:write' = ANY (v_conn.scopes) THEN
            'the connection no longer holds runs:write'
        END;
    IF reason IS NOT NULL OR NOT p_steps THEN
        RETURN;
    END IF;
    v_plan := querylayer.current_plan(p_turn.id);
    IF v_plan.state IS DISTINCT FROM 'active' THEN
        RETURN;
    END IF;
    SELECT s.id, s.key, o.required_scope INTO v_step
      FROM querylayer.task_steps s JOIN querylayer.task_operations o ON o.operation = s.operation
     WHERE s.plan_id = v_plan.id AND s.state IN ('pending', 'running')
       AND NOT (o.required_scope = ANY (v_conn.scopes) AND EXISTS (
                SELECT 1 FROM querylayer.agent_site_permissions p
                 WHERE p.site_id = v_conn.site_id AND p.agent_id = v_conn.agent_id AND p.scope = o.required_scope))
     ORDER BY s.ordinal LIMIT 1;
    IF FOUND THEN
        reason := format('step %s needs %s, which the connection no longer holds', v_step.key, v_step.required_scope);
        step_id := v_step.id;
        step_reason := format('the connection no longer holds %s', v_step.required_scope);
    END IF;
END
$$;

-- Fails closed, with its reason, every task of a site (of one agent, when given) whose
-- binding went: claimed turns and their active plans, and — with p_queued — queued turns whose
-- profile or session no longer holds. p_wait: wait for turns that a call holds locked (the
-- revoking transaction must not miss one); otherwise they are left to that call and the next
-- pass. Returns [{turn_id, reason}].
CREATE FUNCTION querylayer.fail_unbound_tasks(p_site_id uuid, p_agent_id uuid, p_wait boolean, p_queued boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_turn    querylayer.console_turns;
    v_problem record;
    v_plan    querylayer.task_plans;
    v_closed  jsonb := '[]';
BEGIN
    FOR v_turn IN
        SELECT t.* FROM querylayer.console_turns t
          JOIN querylayer.console_conversations c ON c.id = t.conversation_id
         WHERE t.site_id = p_site_id
           AND (t.state = 'claimed' OR (p_queued AND t.state = 'queued'))
           AND (p_agent_id IS NULL OR c.agent_id = p_agent_id)
         ORDER BY t.created_at, t.id
    LOOP
        -- Only a turn with a problem is locked (then looked at again: a call may have ended it).
        CONTINUE WHEN (querylayer.task_binding_problem(v_turn)).reason IS NULL;
        IF p_wait THEN
            SELECT * INTO v_turn FROM querylayer.console_turns WHERE id = v_turn.id FOR UPDATE;
        ELSE
            SELECT * INTO v_turn FROM querylayer.console_turns WHERE id = v_turn.id FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
        END IF;
        CONTINUE WHEN v_turn.state NOT IN ('claimed', 'queued');
        v_problem := querylayer.task_binding_problem(v_turn);
        CONTINUE WHEN v_problem.reason IS NULL;
        v_plan := querylayer.current_plan(v_turn.id);
        IF v_problem.step_id IS NOT NULL THEN
            UPDATE querylayer.task_steps SET state = 'failed', failure_reason = v_problem.step_reason
             WHERE id = v_problem.step_id AND state IN ('pending', 'running');
        END IF;
        IF v_plan.state = 'active' THEN
            PERFORM querylayer.fail_plan(v_plan.id, v_problem.reason);
        END IF;
        IF v_turn.state = 'queued' THEN
            UPDATE querylayer.console_turns SET state = 'failed', ended_at = now(), outcome = 'failed',
                   failure_reason = v_problem.reason
             WHERE id = v_turn.id;
            PERFORM querylayer.audit('turn.fail_closed'::text, v_turn.id::text, jsonb_build_object('reason', v_problem.reason));
        ELSE
            PERFORM querylayer.fail_turn(v_turn.id, v_problem.reason);
        END IF;
        v_closed := v_closed || jsonb_build_object('turn_id', v_turn.id, 'reason', v_problem.reason);
    END LOOP;
    RETURN v_closed;
END
$$;

-- When a binding goes — a connection is revoked, a permission removed, a session ended — the
-- tasks bound to it fail closed in that very transaction, whoever made the change.
CREATE FUNCTION querylayer.fail_tasks_on_unbinding() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_row  jsonb := to_jsonb(CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END);
    v_site uuid := (v_row->>'site_id')::uuid;
    v_prev uuid := querylayer.ctx_site_id();
BEGIN
    -- An operator acting for another site (or for none) acts for this row's site meanwhile.
    IF querylayer.ctx_is_operator() AND v_prev IS DISTINCT FROM v_site THEN
        PERFORM querylayer.enter_operator(v_site);
    END IF;
    PERFORM querylayer.fail_unbound_tasks(v_site, (v_row->>'agent_id')::uuid, true);
    IF querylayer.ctx_is_operator() AND v_prev IS DISTINCT FROM v_site THEN
        PERFORM querylayer.enter_operator(v_prev);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER fail_tasks_on_revocation AFTER UPDATE OF revoked_at ON querylayer.connections
    FOR EACH ROW WHEN (OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL)
    EXECUTE FUNCTION querylayer.fail_tasks_on_unbinding();
ALTER TABLE querylayer.connections ENABLE ALWAYS TRIGGER fail_tasks_on_revocation;
CREATE TRIGGER fail_tasks_on_permission_removal AFTER DELETE ON querylayer.agent_site_permissions
    FOR EACH ROW EXECUTE FUNCTION querylayer.fail_tasks_on_unbinding();
ALTER TABLE querylayer.agent_site_permissions ENABLE ALWAYS TRIGGER fail_tasks_on_permission_removal;
CREATE TRIGGER fail_tasks_on_session_end AFTER UPDATE OF ended_at ON querylayer.agent_sessions
    FOR EACH ROW WHEN (OLD.ended_at IS NULL AND NEW.ended_at IS NOT NULL)
    EXECUTE FUNCTION querylayer.fail_tasks_on_unbinding();
ALTER TABLE querylayer.agent_sessions ENABLE ALWAYS TRIGGER fail_tasks_on_session_end;

-- Advances steps that wait on a human decision: an applied or approved proposal completes the
-- step; a rejected or failed one fails it (a human said no: no automatic retry).
CREATE FUNCTION querylayer.settle_awaiting_steps(p_plan_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    s       querylayer.task_steps;
    v_state text;
BEGIN
    FOR s IN SELECT * FROM querylayer.task_steps WHERE plan_id = p_plan_id AND state = 'awaiting_approval' FOR UPDATE LOOP
        v_state := querylayer.proposal_json(s.proposal_id)->>'state';
        IF v_state IN ('applied', 'approved') THEN
            UPDATE querylayer.task_steps SET state = 'succeeded' WHERE id = s.id;
        ELSIF v_state IN ('rejected', 'failed') THEN
            UPDATE querylayer.task_steps SET state = 'failed',
                   failure_reason = format('proposal %s was %s', s.proposal_id, v_state) WHERE id = s.id;
            PERFORM querylayer.fail_plan(p_plan_id, format('step %s: proposal %s', s.key, v_state));
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- The scheduler: settles decided proposals, then hands out at most one dependency-ready step,
-- after re-checking the session and the permission the step needs. Returns what the harness
-- should know: the step to run now, or why there is none.
CREATE FUNCTION querylayer.next_step(p_plan_id uuid, p_session_id text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_plan    querylayer.task_plans;
    v_conv    querylayer.console_conversations;
    v_problem text;
    v_step    querylayer.task_steps;
    v_scope   text;
BEGIN
    SELECT * INTO v_plan FROM querylayer.task_plans WHERE id = p_plan_id FOR UPDATE;
    IF v_plan.state <> 'active' THEN
        RETURN jsonb_build_object('status', v_plan.state, 'step', NULL, 'plan', querylayer.plan_json(p_plan_id));
    END IF;
    IF p_session_id IS DISTINCT FROM v_plan.session_id THEN
        RAISE EXCEPTION 'this plan runs only through Hermes session %', v_plan.session_id USING ERRCODE = 'QL403';
    END IF;
    SELECT c.* INTO v_conv FROM querylayer.console_conversations c
      JOIN querylayer.console_turns t ON t.conversation_id = c.id WHERE t.id = v_plan.turn_id;
    v_problem := querylayer.conversation_problem(v_conv);
    IF v_problem IS NOT NULL THEN
        PERFORM querylayer.fail_plan(p_plan_id, v_problem);
        RETURN jsonb_build_object('status', 'failed', 'reason', v_problem, 'step', NULL, 'plan', querylayer.plan_json(p_plan_id));
    END IF;
    PERFORM querylayer.settle_awaiting_steps(p_plan_id);
    SELECT state INTO v_plan.state FROM querylayer.task_plans WHERE id = p_plan_id;
    IF v_plan.state <> 'active' THEN
        RETURN jsonb_build_object('status', v_plan.state, 'step', NULL, 'plan', querylayer.plan_json(p_plan_id));
    END IF;
    IF EXISTS (SELECT 1 FROM querylayer.task_steps WHERE plan_id = p_plan_id AND state = 'running') THEN
        SELECT * INTO v_step FROM querylayer.task_steps WHERE plan_id = p_plan_id AND state = 'running';
        RETURN jsonb_build_object('status', 'running', 'step', querylayer.plan_json(p_plan_id)->'steps'->(v_step.ordinal),
                                  'plan', querylayer.plan_json(p_plan_id));
    END IF;
    SELECT * INTO v_step FROM querylayer.task_steps s
     WHERE s.plan_id = p_plan_id AND s.state = 'pending'
       AND NOT EXISTS (SELECT 1 FROM unnest(s.depends_on) d
                        JOIN querylayer.task_steps x ON x.plan_id = s.plan_id AND x.key = d
                       WHERE x.state <> 'succeeded')
     ORDER BY s.ordinal LIMIT 1;
    IF NOT FOUND THEN
        IF NOT EXISTS (SELECT 1 FROM querylayer.task_steps WHERE plan_id = p_plan_id AND state <> 'succeeded') THEN
            UPDATE querylayer.task_plans SET state = 'completed', ended_at = now() WHERE id = p_plan_id;
            RETURN jsonb_build_object('status', 'completed', 'step', NULL, 'plan', querylayer.plan_json(p_plan_id));
        END IF;
        RETURN jsonb_build_object('status', 'awaiting_approval', 'step', NULL, 'plan', querylayer.plan_json(p_plan_id),
            'hint', 'a step waits on a human decision; claim again after a member decides');
    END IF;
    SELECT required_scope INTO v_scope FROM querylayer.task_operations WHERE operation = v_step.operation;
    IF NOT (v_scope = ANY (querylayer.ctx_scopes())) THEN
        UPDATE querylayer.task_steps SET state = 'failed', failure_reason = format('the connection no longer holds %s', v_scope)
         WHERE id = v_step.id;
        PERFORM querylayer.fail_plan(p_plan_id, format('step %s needs %s, which the connection no longer holds', v_step.key, v_scope));
        RETURN jsonb_build_object('status', 'failed', 'step', NULL, 'plan', querylayer.plan_json(p_plan_id));
    END IF;
    UPDATE querylayer.task_steps SET state = 'running' WHERE id = v_step.id;
    RETURN jsonb_build_object('status', 'running', 'step', querylayer.plan_json(p_plan_id)->'steps'->(v_step.ordinal),
                              'plan', querylayer.plan_json(p_plan_id));
END
$$;

-- The turn this connection holds, locked; refuses a turn it did not claim.
CREATE FUNCTION querylayer.claimed_turn(p_turn_id uuid) RETURNS querylayer.console_turns
LANGUAGE plpgsql AS $$
DECLARE
    v querylayer.console_turns;
BEGIN
    SELECT * INTO v FROM querylayer.console_turns WHERE id = p_turn_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no console turn % on this site', p_turn_id USING ERRCODE = 'QL404';
    END IF;
    IF v.claimed_connection_id IS DISTINCT FROM querylayer.ctx_connection_id() THEN
        RAISE EXCEPTION 'turn % was not claimed by this connection', p_turn_id USING ERRCODE = 'QL403';
    END IF;
    IF v.state <> 'claimed' THEN
        RAISE EXCEPTION 'turn % is %; nothing more is accepted for it', p_turn_id,
            v.state || coalesce(' (' || v.failure_reason || ')', '') USING ERRCODE = 'QL422',
            HINT = CASE WHEN v.state IN ('failed', 'cancelled') THEN 'a member may re-open the turn' END;
    END IF;
    RETURN v;
END
$$;

CREATE FUNCTION querylayer.current_plan(p_turn_id uuid) RETURNS querylayer.task_plans
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v querylayer.task_plans;
BEGIN
    SELECT * INTO v FROM querylayer.task_plans WHERE turn_id = p_turn_id ORDER BY version DESC LIMIT 1;
    RETURN v;
END
$$;

-- -------------------------------------------------------------------------------------------
-- Agent tools (connection context).

-- Claims work. Without a claimed turn: the next queued turn of this agent's conversations on the
-- site (one claimant per turn: rows are taken with SKIP LOCKED), failing closed any turn whose
-- profile or session no longer holds. With a claimed turn that has a plan: the next
-- dependency-ready step of its current plan version, through the plan's session only.
CREATE FUNCTION querylayer_api.claim_console_task(p_session_id text DEFAULT NULL, p_turn_id uuid DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_turn    querylayer.console_turns;
    v_conv    querylayer.console_conversations;
    v_plan    querylayer.task_plans;
    v_problem text;
    v_closed  jsonb := '[]';
BEGIN
    PERFORM querylayer.require_connection('runs:write'::text);
    IF p_turn_id IS NOT NULL THEN
        SELECT * INTO v_turn FROM querylayer.console_turns WHERE id = p_turn_id FOR UPDATE;
        IF FOUND AND v_turn.claimed_connection_id = querylayer.ctx_connection_id()
           AND v_turn.state IN ('completed', 'failed', 'cancelled') THEN
            -- The turn ended (failed closed, or a member cancelled it): say so, hand out nothing.
            RETURN jsonb_build_object('turn', querylayer.turn_json(v_turn.id), 'status', v_turn.state, 'step', NULL,
                'reason', v_turn.failure_reason, 'plan', querylayer.plan_json((querylayer.current_plan(v_turn.id)).id));
        END IF;
        v_turn := querylayer.claimed_turn(p_turn_id);
        v_plan := querylayer.current_plan(v_turn.id);
        IF v_plan.id IS NULL OR v_plan.state IN ('failed', 'cancelled') THEN
            RETURN jsonb_build_object('turn', querylayer.turn_json(v_turn.id), 'plan', NULL, 'status', 'needs_plan',
                'hint', 'create a task plan for this turn with querylayer_create_task_plan');
        END IF;
        RETURN jsonb_build_object('turn', querylayer.turn_json(v_turn.id)) || querylayer.next_step(v_plan.id, p_session_id);
    END IF;
    -- The next touch: this agent's turns stranded by a binding that went (a connection that
    -- expired, say) fail closed now, and are listed under `closed`.
    v_closed := querylayer.fail_unbound_tasks(querylayer.ctx_site_id(), querylayer.ctx_agent_id(), false);
    LOOP
        SELECT t.* INTO v_turn
          FROM querylayer.console_turns t
          JOIN querylayer.console_conversations c ON c.id = t.conversation_id
         WHERE t.site_id = querylayer.ctx_site_id() AND t.state = 'queued'
           AND c.agent_id = querylayer.ctx_agent_id()
           AND (p_session_id IS NULL OR c.session_id = p_session_id)
         ORDER BY t.created_at, t.id
         LIMIT 1
           FOR UPDATE OF t SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN jsonb_build_object('turn', NULL, 'status', 'idle', 'closed', v_closed);
        END IF;
        SELECT * INTO v_conv FROM querylayer.console_conversations WHERE id = v_turn.conversation_id;
        v_problem := querylayer.conversation_problem(v_conv);
        IF v_problem IS NULL THEN
            EXIT;
        END IF;
        UPDATE querylayer.console_turns SET state = 'failed', ended_at = now(), failure_reason = v_problem
         WHERE id = v_turn.id;
        PERFORM querylayer.audit('turn.fail_closed'::text, v_turn.id::text, jsonb_build_object('reason', v_problem));
        v_closed := v_closed || jsonb_build_object('turn_id', v_turn.id, 'reason', v_problem);
    END LOOP;
    UPDATE querylayer.console_turns
       SET state = 'claimed', claimed_connection_id = querylayer.ctx_connection_id(),
           claimed_session_id = v_conv.session_id, claimed_at = now()
     WHERE id = v_turn.id;
    PERFORM querylayer.audit('turn.claim'::text, v_turn.id::text, jsonb_build_object('session_id', v_conv.session_id));
    RETURN jsonb_build_object('turn', querylayer.turn_json(v_turn.id), 'status', 'claimed', 'plan', NULL,
                              'closed', v_closed,
                              'hint', 'plan multi-step work with querylayer_create_task_plan, or complete the turn');
END
$$;

-- Turns a multi-step goal into a new version of the turn's plan (the previous version is
-- superseded, not rewritten). Steps: [{key, operation, instructions, depends_on: [keys]}].
CREATE FUNCTION querylayer_api.create_task_plan(p_turn_id uuid, p_session_id text, p_goal text, p_steps jsonb)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_turn    querylayer.console_turns;
    v_conv    querylayer.console_conversations;
    v_prev    querylayer.task_plans;
    v_plan    querylayer.task_plans;
    v_problem text;
    v_step    jsonb;
    v_n       integer := 0;
    v_keys    text[] := '{}';
    v_bad     text;
BEGIN
    PERFORM querylayer.require_connection('runs:write'::text);
    v_turn := querylayer.claimed_turn(p_turn_id);
    SELECT * INTO v_conv FROM querylayer.console_conversations WHERE id = v_turn.conversation_id;
    IF p_session_id IS DISTINCT FROM v_conv.session_id THEN
        RAISE EXCEPTION 'session_id: this turn belongs to Hermes session %', v_conv.session_id USING ERRCODE = 'QL403';
    END IF;
    v_problem := querylayer.conversation_problem(v_conv);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'cannot plan: %', v_problem USING ERRCODE = 'QL422';
    END IF;
    IF p_goal IS NULL OR length(p_goal) NOT BETWEEN 1 AND 4000 THEN
        RAISE EXCEPTION 'goal: 1 to 4000 characters are required' USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(p_steps) IS DISTINCT FROM 'array' OR jsonb_array_length(p_steps) NOT BETWEEN 1 AND 50 THEN
        RAISE EXCEPTION 'steps: an array of 1 to 50 steps is required' USING ERRCODE = '22023';
    END IF;
    FOR v_step IN SELECT * FROM jsonb_array_elements(p_steps) LOOP
        IF jsonb_typeof(v_step->'key') IS DISTINCT FROM 'string' OR (v_step->>'key') !~ '^[a-z0-9][a-z0-9_-]{0,62}$' THEN
            RAISE EXCEPTION 'steps[%].key: lowercase letters, digits, _ and - are required', v_n USING ERRCODE = '22023';
        END IF;
        IF (v_step->>'key') = ANY (v_keys) THEN
            RAISE EXCEPTION 'steps[%].key: % is used twice', v_n, v_step->>'key' USING ERRCODE = '22023';
        END IF;
        v_keys := v_keys || (v_step->>'key');
        IF NOT EXISTS (SELECT 1 FROM querylayer.task_operations WHERE operation = v_step->>'operation') THEN
            RAISE EXCEPTION 'steps[%].operation must be one of %', v_n,
                (SELECT string_agg(operation, ', ' ORDER BY operation) FROM querylayer.task_operations) USING ERRCODE = '22023';
        END IF;
        -- A step this connection could never run is not planned (the scheduler checks again
        -- when it hands the step out, and the task fails closed if the permission goes).
        SELECT required_scope INTO v_bad FROM querylayer.task_operations
         WHERE operation = v_step->>'operation' AND NOT required_scope = ANY (querylayer.ctx_scopes());
        IF v_bad IS NOT NULL THEN
            RAISE EXCEPTION 'steps[%] (%) needs %, which this connection does not hold', v_n, v_step->>'operation', v_bad
                USING ERRCODE = 'QL403';
        END IF;
        IF jsonb_typeof(v_step->'instructions') IS DISTINCT FROM 'string' OR length(v_step->>'instructions') NOT BETWEEN 1 AND 4000 THEN
            RAISE EXCEPTION 'steps[%].instructions: 1 to 4000 characters are required', v_n USING ERRCODE = '22023';
        END IF;
        IF v_step ? 'depends_on' AND (jsonb_typeof(v_step->'depends_on') <> 'array'
           OR EXISTS (SELECT 1 FROM jsonb_array_elements(v_step->'depends_on') d WHERE jsonb_typeof(d) <> 'string')) THEN
            RAISE EXCEPTION 'steps[%].depends_on must be an array of step keys', v_n USING ERRCODE = '22023';
        END IF;
        v_n := v_n + 1;
    END LOOP;
    -- Dependencies name known steps and form no cycle.
    SELECT format('steps: %s depends on unknown step %s', s->>'key', d) INTO v_bad
      FROM jsonb_array_elements(p_steps) s, jsonb_array_elements_text(coalesce(s->'depends_on', '[]')) d
     WHERE NOT d = ANY (v_keys) LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION '%', v_bad USING ERRCODE = '22023';
    END IF;
    WITH RECURSIVE edges(k, d) AS (
        SELECT s->>'key', d FROM jsonb_array_elements(p_steps) s, jsonb_array_elements_text(coalesce(s->'depends_on', '[]')) d),
    walk(start, k, path) AS (
        SELECT k, d, ARRAY[k, d] FROM edges
        UNION ALL
        SELECT w.start, e.d, w.path || e.d FROM walk w JOIN edges e ON e.k = w.k
         WHERE NOT e.d = ANY (w.path[2:]) AND cardinality(w.path) <= 52)
    SELECT format('steps: dependency cycle %s', array_to_string(path, ' → ')) INTO v_bad
      FROM walk WHERE k = start LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION '%', v_bad USING ERRCODE = '22023';
    END IF;

    v_prev := querylayer.current_plan(v_turn.id);
    IF v_prev.id IS NOT NULL THEN
        UPDATE querylayer.task_steps SET state = 'superseded'
         WHERE plan_id = v_prev.id AND state IN ('pending', 'running', 'awaiting_approval');
        UPDATE querylayer.task_plans SET state = 'superseded', ended_at = now() WHERE id = v_prev.id AND state = 'active';
    END IF;
    INSERT INTO querylayer.task_plans (site_id, turn_id, version, goal, agent_id, profile_id, session_id, connection_id)
    VALUES (v_turn.site_id, v_turn.id, coalesce(v_prev.version, 0) + 1, p_goal, v_conv.agent_id, v_conv.profile_id,
            v_conv.session_id, querylayer.ctx_connection_id())
    RETURNING * INTO v_plan;
    INSERT INTO querylayer.task_steps (site_id, plan_id, key, ordinal, operation, risk, depends_on, instructions)
    SELECT v_plan.site_id, v_plan.id, s->>'key', (o - 1)::integer, s->>'operation', 'low',
           ARRAY(SELECT jsonb_array_elements_text(coalesce(s->'depends_on', '[]'))), s->>'instructions'
      FROM jsonb_array_elements(p_steps) WITH ORDINALITY AS x(s, o);
    PERFORM querylayer.audit('plan.create'::text, v_plan.id::text, jsonb_build_object('turn_id', v_turn.id, 'version', v_plan.version));
    RETURN jsonb_build_object('turn', querylayer.turn_json(v_turn.id)) || querylayer.next_step(v_plan.id, p_session_id);
END
$$;

-- Completes work. With p_step_id: reports the running step (succeeded, or failed — retried
-- automatically while the turn has retries left, two in all across its steps and plan versions;
-- then the step, the plan and the turn fail and dependents never start; a proposal-producing
-- step must name its proposal and then waits for the human decision) and returns the next step.
-- A report whose task lost its binding (its session ended, say) is refused. Without p_step_id:
-- completes the claimed turn with a result referencing runs and proposals.
CREATE FUNCTION querylayer_api.complete_console_task(
    p_turn_id uuid, p_outcome text, p_session_id text DEFAULT NULL, p_step_id uuid DEFAULT NULL,
    p_summary text DEFAULT NULL, p_run_ids uuid[] DEFAULT '{}', p_proposal_ids uuid[] DEFAULT '{}'
) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_turn    querylayer.console_turns;
    v_plan    querylayer.task_plans;
    v_step    querylayer.task_steps;
    v_ptype   text;
    v_prop    jsonb;
    v_bad     uuid;
    v_problem record;
BEGIN
    PERFORM querylayer.require_connection('runs:write'::text);
    v_turn := querylayer.claimed_turn(p_turn_id);
    IF p_summary IS NOT NULL AND length(p_summary) > 4000 THEN
        RAISE EXCEPTION 'summary: at most 4000 characters' USING ERRCODE = '22023';
    END IF;
    SELECT r INTO v_bad FROM unnest(coalesce(p_run_ids, '{}')) r
     WHERE NOT EXISTS (SELECT 1 FROM querylayer.runs x WHERE x.id = r AND x.connection_id = querylayer.ctx_connection_id()) LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'run_ids: % is not a run of this connection', v_bad USING ERRCODE = '22023';
    END IF;
    SELECT p INTO v_bad FROM unnest(coalesce(p_proposal_ids, '{}')) p
     WHERE NOT EXISTS (SELECT 1 FROM querylayer.proposals x WHERE x.id = p AND x.connection_id = querylayer.ctx_connection_id()) LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'proposal_ids: % is not a proposal of this connection', v_bad USING ERRCODE = '22023';
    END IF;

    IF p_step_id IS NULL THEN
        IF p_outcome NOT IN ('completed', 'failed') THEN
            RAISE EXCEPTION 'outcome for a turn must be completed or failed' USING ERRCODE = '22023';
        END IF;
        v_plan := querylayer.current_plan(v_turn.id);
        IF p_outcome = 'completed' AND v_plan.id IS NOT NULL AND v_plan.state NOT IN ('completed') THEN
            RAISE EXCEPTION 'the turn''s plan (version %) is %; finish or fail it first', v_plan.version, v_plan.state
                USING ERRCODE = 'QL422';
        END IF;
        UPDATE querylayer.console_turns
           SET state = p_outcome, ended_at = now(), outcome = p_outcome,
               failure_reason = CASE WHEN p_outcome = 'failed' THEN p_summary END,
               result = jsonb_build_object('summary', p_summary, 'run_ids', to_jsonb(coalesce(p_run_ids, '{}')),
                                           'proposal_ids', to_jsonb(coalesce(p_proposal_ids, '{}')))
         WHERE id = v_turn.id;
        IF v_plan.id IS NOT NULL AND v_plan.state = 'active' THEN
            PERFORM querylayer.fail_plan(v_plan.id, 'the turn ended as ' || p_outcome);
        END IF;
        PERFORM querylayer.audit('turn.complete'::text, v_turn.id::text, jsonb_build_object('outcome', p_outcome));
        RETURN jsonb_build_object('turn', querylayer.turn_json(v_turn.id));
    END IF;

    IF p_outcome NOT IN ('succeeded', 'failed') THEN
        RAISE EXCEPTION 'outcome for a step must be succeeded or failed' USING ERRCODE = '22023';
    END IF;
    v_plan := querylayer.current_plan(v_turn.id);
    SELECT * INTO v_step FROM querylayer.task_steps WHERE id = p_step_id AND plan_id = v_plan.id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'step % is not in the current plan of turn %', p_step_id, p_turn_id USING ERRCODE = 'QL404';
    END IF;
    IF p_session_id IS DISTINCT FROM v_plan.session_id THEN
        RAISE EXCEPTION 'this plan runs only through Hermes session %', v_plan.session_id USING ERRCODE = 'QL403';
    END IF;
    IF v_step.state <> 'running' THEN
        RAISE EXCEPTION 'step % is %, not running; claim it first', v_step.key, v_step.state USING ERRCODE = 'QL422';
    END IF;
    -- Work reported for a task whose binding went is not accepted: the task fails closed (here
    -- the refusal rolls back, so the next claim or the worker's pass records it).
    v_problem := querylayer.task_binding_problem(v_turn, false);
    IF v_problem.reason IS NOT NULL THEN
        RAISE EXCEPTION 'the report on step % is refused: %', v_step.key, v_problem.reason USING ERRCODE = 'QL422',
            HINT = 'the task fails closed; a member may re-open the turn';
    END IF;
    IF p_outcome = 'failed' THEN
        IF v_turn.retries_used < 2 THEN
            UPDATE querylayer.task_steps SET state = 'pending', retry_count = retry_count + 1,
                   failure_reason = p_summary, run_id = coalesce(p_run_ids[1], run_id)
             WHERE id = v_step.id;
            UPDATE querylayer.console_turns SET retries_used = retries_used + 1 WHERE id = v_turn.id;
            PERFORM querylayer.audit('step.retry'::text, v_step.id::text,
                jsonb_build_object('retry', v_step.retry_count + 1, 'turn_retries_left', 1 - v_turn.retries_used));
        ELSE
            UPDATE querylayer.task_steps SET state = 'failed', failure_reason = coalesce(p_summary, 'failed'),
                   run_id = coalesce(p_run_ids[1], run_id)
             WHERE id = v_step.id;
            PERFORM querylayer.fail_plan(v_plan.id, format('step %s failed after 2 automatic retries', v_step.key));
        END IF;
    ELSE
        SELECT proposal_type INTO v_ptype FROM querylayer.task_operations WHERE operation = v_step.operation;
        IF v_ptype IS NOT NULL THEN
            IF cardinality(coalesce(p_proposal_ids, '{}')) <> 1 THEN
                RAISE EXCEPTION 'step % (%) must name the one % proposal it produced', v_step.key, v_step.operation, v_ptype
                    USING ERRCODE = 'QL422', HINT = 'create it with querylayer_create_proposal or querylayer_request_publish_approval';
            END IF;
            v_prop := querylayer.proposal_json(p_proposal_ids[1]);
            IF v_prop->>'type' <> v_ptype THEN
                RAISE EXCEPTION 'step % needs a % proposal, not %', v_step.key, v_ptype, v_prop->>'type' USING ERRCODE = 'QL422';
            END IF;
            UPDATE querylayer.task_steps SET state = 'awaiting_approval', proposal_id = p_proposal_ids[1],
                   run_id = coalesce(p_run_ids[1], run_id), result = jsonb_build_object('summary', p_summary)
             WHERE id = v_step.id;
        ELSE
            UPDATE querylayer.task_steps SET state = 'succeeded', run_id = coalesce(p_run_ids[1], run_id),
                   result = jsonb_build_object('summary', p_summary, 'run_ids', to_jsonb(coalesce(p_run_ids, '{}')))
             WHERE id = v_step.id;
        END IF;
    END IF;
    PERFORM querylayer.audit('step.report'::text, v_step.id::text, jsonb_build_object('outcome', p_outcome));
    RETURN jsonb_build_object('turn', querylayer.turn_json(v_turn.id)) || querylayer.next_step(v_plan.id, p_session_id);
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.claim_console_task, querylayer_api.create_task_plan,
    querylayer_api.complete_console_task TO querylayer_edge;

-- -------------------------------------------------------------------------------------------
-- Console functions (member context).

CREATE FUNCTION querylayer_api.console_register_session(p_profile_id text, p_session_id text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_agent    querylayer.agents;
    v_existing querylayer.agent_sessions;
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin', 'editor']);
    v_agent := querylayer.agent_by_profile_id(p_profile_id);
    IF v_agent.organization_id <> querylayer.ctx_organization_id() THEN
        RAISE EXCEPTION 'no agent is bound to profile_id %', quote_literal(p_profile_id) USING ERRCODE = 'QL404';
    END IF;
    IF p_session_id IS NULL OR p_session_id !~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$' THEN
        RAISE EXCEPTION 'session_id: letters, digits and ._:- (at most 128) are required' USING ERRCODE = '22023';
    END IF;
    -- One stored session, one registration: concurrent registrations (on this site or any other)
    -- insert it once; every other one is told where it stands. Another site's row is invisible
    -- here, but its key is not.
    INSERT INTO querylayer.agent_sessions (site_id, session_id, agent_id, profile_id, registered_by)
    VALUES (querylayer.ctx_site_id(), p_session_id, v_agent.id, v_agent.profile_id, querylayer.ctx_member_id())
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        SELECT * INTO v_existing FROM querylayer.agent_sessions
         WHERE site_id = querylayer.ctx_site_id() AND session_id = p_session_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'session % of profile % is registered on another site; one Hermes session has one conversation',
                p_session_id, v_agent.profile_id USING ERRCODE = 'QL409',
                HINT = 'open its conversation on the site that registered it; QueryLayer never opens a second one';
        ELSIF v_existing.profile_id IS DISTINCT FROM v_agent.profile_id THEN
            RAISE EXCEPTION 'session id % is already registered on this site, for profile %', p_session_id, v_existing.profile_id
                USING ERRCODE = 'QL409';
        END IF;
        RAISE EXCEPTION 'session % is already registered on this site', p_session_id USING ERRCODE = 'QL409';
    END IF;
    PERFORM querylayer.audit('session.register'::text, p_session_id, jsonb_build_object('profile_id', p_profile_id));
    RETURN jsonb_build_object('session_id', p_session_id, 'profile_id', v_agent.profile_id, 'agent', v_agent.handle);
END
$$;

-- Records that a Hermes session ended or went missing; its conversation then fails closed.
CREATE FUNCTION querylayer_api.console_end_session(p_session_id text, p_reason text DEFAULT 'ended') RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin', 'editor']);
    UPDATE querylayer.agent_sessions SET ended_at = now(), ended_reason = coalesce(p_reason, 'ended')
     WHERE site_id = querylayer.ctx_site_id() AND session_id = p_session_id AND ended_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no open session % on this site', coalesce(quote_literal(p_session_id), 'NULL') USING ERRCODE = 'QL404';
    END IF;
    PERFORM querylayer.audit('session.end'::text, p_session_id, jsonb_build_object('reason', p_reason));
    RETURN jsonb_build_object('session_id', p_session_id, 'ended', true);
END
$$;

CREATE FUNCTION querylayer_api.console_open_conversation(p_profile_id text, p_session_id text, p_title text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_session querylayer.agent_sessions;
    v_conv    querylayer.console_conversations;
    v_problem text;
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin', 'editor']);
    SELECT * INTO v_session FROM querylayer.agent_sessions
     WHERE site_id = querylayer.ctx_site_id() AND session_id = p_session_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'session % is not registered on this site', coalesce(quote_literal(p_session_id), 'NULL')
            USING ERRCODE = 'QL404', HINT = 'QueryLayer never creates a Hermes session; register the existing one first';
    END IF;
    IF v_session.profile_id IS DISTINCT FROM p_profile_id THEN
        RAISE EXCEPTION 'session % belongs to profile %, not %', p_session_id, v_session.profile_id, coalesce(p_profile_id, 'NULL')
            USING ERRCODE = 'QL422';
    END IF;
    INSERT INTO querylayer.console_conversations (site_id, agent_id, profile_id, session_id, title, opened_by)
    VALUES (querylayer.ctx_site_id(), v_session.agent_id, v_session.profile_id, p_session_id,
            coalesce(p_title, 'Conversation'), querylayer.ctx_member_id())
    ON CONFLICT DO NOTHING
    RETURNING * INTO v_conv;
    IF v_conv.id IS NULL THEN
        RAISE EXCEPTION 'session % already has its conversation', p_session_id USING ERRCODE = 'QL409',
            HINT = 'one Hermes session has one conversation; list conversations to find it';
    END IF;
    v_problem := querylayer.conversation_problem(v_conv);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'cannot open the conversation: %', v_problem USING ERRCODE = 'QL422';
    END IF;
    PERFORM querylayer.audit('conversation.open'::text, v_conv.id::text, jsonb_build_object('session_id', p_session_id));
    RETURN jsonb_build_object('conversation_id', v_conv.id, 'session_id', v_conv.session_id,
                              'profile_id', v_conv.profile_id, 'title', v_conv.title);
END
$$;

CREATE FUNCTION querylayer_api.console_add_turn(p_conversation_id uuid, p_request text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_conv    querylayer.console_conversations;
    v_id      uuid;
    v_problem text;
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin', 'editor']);
    SELECT * INTO v_conv FROM querylayer.console_conversations WHERE id = p_conversation_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no conversation % on this site', p_conversation_id USING ERRCODE = 'QL404';
    END IF;
    IF p_request IS NULL OR length(p_request) NOT BETWEEN 1 AND 20000 THEN
        RAISE EXCEPTION 'request: 1 to 20000 characters are required' USING ERRCODE = '22023';
    END IF;
    -- A turn no harness could ever act on is refused now, not queued to fail at claim time.
    v_problem := querylayer.conversation_problem(v_conv);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'conversation % takes no new turns: %', p_conversation_id, v_problem USING ERRCODE = 'QL422';
    END IF;
    INSERT INTO querylayer.console_turns (site_id, conversation_id, request, created_by)
    VALUES (v_conv.site_id, v_conv.id, p_request, querylayer.ctx_member_id())
    RETURNING id INTO v_id;
    PERFORM querylayer.audit('turn.create'::text, v_id::text, jsonb_build_object('conversation_id', v_conv.id));
    RETURN querylayer.turn_json(v_id);
END
$$;

-- The Hermes deep link of a conversation, exactly hermes://sessions/{session_id}?profile_id={id}.
-- Refused for an unknown or ambiguous profile or a missing session: never a link elsewhere.
CREATE FUNCTION querylayer_api.console_conversation_link(p_conversation_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_conv    querylayer.console_conversations;
    v_problem text;
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    SELECT * INTO v_conv FROM querylayer.console_conversations WHERE id = p_conversation_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no conversation % on this site', p_conversation_id USING ERRCODE = 'QL404';
    END IF;
    v_problem := querylayer.conversation_problem(v_conv);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'no link for conversation %: %', p_conversation_id, v_problem USING ERRCODE = 'QL422';
    END IF;
    RETURN jsonb_build_object('conversation_id', v_conv.id,
        'link', format('hermes://sessions/%s?profile_id=%s', v_conv.session_id, v_conv.profile_id));
END
$$;

-- Newest first; a page of p_limit conversations and the cursor of the next. Each carries its
-- newest turns (at most 20, oldest of them first) and how many it has; all of them, page by
-- page: console_list_turns.
CREATE FUNCTION querylayer_api.console_list_conversations(p_limit integer DEFAULT 50, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('conversations'::text, p_cursor);
    RETURN querylayer.page('conversations'::text, 'conversations'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', querylayer.page_key(c.created_at), 'id', c.id, 'item', jsonb_build_object(
                'conversation_id', c.id, 'title', c.title, 'session_id', c.session_id, 'profile_id', c.profile_id,
                'agent', a.handle, 'profile_name', a.profile_name, 'created_at', c.created_at,
                'problem', querylayer.conversation_problem(c),
                'turn_count', (SELECT count(*) FROM querylayer.console_turns t WHERE t.conversation_id = c.id),
                'turns', (SELECT coalesce(jsonb_agg(querylayer.turn_json(t.id) ORDER BY t.created_at, t.id), '[]')
                            FROM (SELECT * FROM querylayer.console_turns t WHERE t.conversation_id = c.id
                                   ORDER BY t.created_at DESC, t.id DESC LIMIT 20) t)))
               ORDER BY c.created_at DESC, c.id DESC)
          FROM (SELECT * FROM querylayer.console_conversations x
                 WHERE x.site_id = querylayer.ctx_site_id()
                   AND (v_after.after_id IS NULL
                        OR (x.created_at, x.id) < (v_after.after_key::timestamptz, v_after.after_id))
                 ORDER BY x.created_at DESC, x.id DESC LIMIT p_limit + 1) c
          JOIN querylayer.agents a ON a.id = c.agent_id));
END
$$;

-- A conversation's turns, oldest first; a page of p_limit and the cursor of the next.
CREATE FUNCTION querylayer_api.console_list_turns(p_conversation_id uuid, p_limit integer DEFAULT 50,
                                                  p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('turns'::text, p_cursor);
    IF NOT EXISTS (SELECT 1 FROM querylayer.console_conversations WHERE id = p_conversation_id) THEN
        RAISE EXCEPTION 'no conversation % on this site', p_conversation_id USING ERRCODE = 'QL404';
    END IF;
    RETURN querylayer.page('turns'::text, 'turns'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('item', querylayer.turn_json(t.id), 'key', querylayer.page_key(t.created_at),
                                            'id', t.id) ORDER BY t.created_at, t.id)
          FROM (SELECT * FROM querylayer.console_turns x
                 WHERE x.conversation_id = p_conversation_id
                   AND (v_after.after_id IS NULL
                        OR (x.created_at, x.id) > (v_after.after_key::timestamptz, v_after.after_id))
                 ORDER BY x.created_at, x.id LIMIT p_limit + 1) t));
END
$$;

-- A turn with its plan versions, steps, runs and proposals.
CREATE FUNCTION querylayer_api.console_get_turn(p_turn_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_turn jsonb := querylayer.turn_json(p_turn_id);
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    IF v_turn IS NULL THEN
        RAISE EXCEPTION 'no console turn % on this site', p_turn_id USING ERRCODE = 'QL404';
    END IF;
    RETURN v_turn || jsonb_build_object(
        'plans', (SELECT coalesce(jsonb_agg(querylayer.plan_json(p.id) ORDER BY p.version), '[]')
                    FROM querylayer.task_plans p WHERE p.turn_id = p_turn_id),
        'runs', (SELECT coalesce(jsonb_agg(DISTINCT to_jsonb(r.run_id)), '[]') FROM (
                    SELECT s.run_id FROM querylayer.task_steps s JOIN querylayer.task_plans p ON p.id = s.plan_id
                     WHERE p.turn_id = p_turn_id AND s.run_id IS NOT NULL
                    UNION SELECT (jsonb_array_elements_text(v_turn->'result'->'run_ids'))::uuid) r),
        'proposals', (SELECT coalesce(jsonb_agg(querylayer.proposal_json(x.proposal_id)), '[]') FROM (
                    SELECT s.proposal_id FROM querylayer.task_steps s JOIN querylayer.task_plans p ON p.id = s.plan_id
                     WHERE p.turn_id = p_turn_id AND s.proposal_id IS NOT NULL
                    UNION SELECT (jsonb_array_elements_text(v_turn->'result'->'proposal_ids'))::uuid) x));
END
$$;

-- A member's cancel ends the turn: the plan, its unfinished steps and the turn are cancelled
-- with the reason, and no new plan version may start on the turn (until a member re-opens it).
CREATE FUNCTION querylayer_api.console_cancel_plan(p_plan_id uuid, p_reason text DEFAULT 'cancelled by a member') RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_plan querylayer.task_plans;
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin', 'editor']);
    SELECT * INTO v_plan FROM querylayer.task_plans WHERE id = p_plan_id;
    IF FOUND THEN
        -- The turn first, as every writer of a task does, so a harness's call and this cancel queue.
        PERFORM 1 FROM querylayer.console_turns WHERE id = v_plan.turn_id FOR UPDATE;
        SELECT * INTO v_plan FROM querylayer.task_plans WHERE id = p_plan_id;
    END IF;
    IF v_plan.state IS DISTINCT FROM 'active' THEN
        RAISE EXCEPTION 'no active plan % on this site', p_plan_id USING ERRCODE = 'QL404';
    END IF;
    PERFORM querylayer.cancel_turn(v_plan.turn_id, coalesce(p_reason, 'cancelled by a member'));
    RETURN querylayer.plan_json(p_plan_id);
END
$$;

-- Cancels a queued or claimed turn (and its active plan, if any).
CREATE FUNCTION querylayer_api.console_cancel_turn(p_turn_id uuid, p_reason text DEFAULT 'cancelled by a member') RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_turn querylayer.console_turns;
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin', 'editor']);
    SELECT * INTO v_turn FROM querylayer.console_turns WHERE id = p_turn_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no console turn % on this site', p_turn_id USING ERRCODE = 'QL404';
    END IF;
    IF v_turn.state NOT IN ('queued', 'claimed') THEN
        RAISE EXCEPTION 'turn % is already %', p_turn_id, v_turn.state USING ERRCODE = 'QL422';
    END IF;
    PERFORM querylayer.cancel_turn(v_turn.id, coalesce(p_reason, 'cancelled by a member'));
    RETURN querylayer.turn_json(v_turn.id);
END
$$;

-- A member re-opens a failed or cancelled turn: it is queued again (any harness of the agent may
-- claim it and plan anew) with its two automatic retries restored. Refused while the
-- conversation's profile or session does not hold.
CREATE FUNCTION querylayer_api.console_reopen_turn(p_turn_id uuid, p_note text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_turn    querylayer.console_turns;
    v_conv    querylayer.console_conversations;
    v_problem text;
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin', 'editor']);
    IF p_note IS NOT NULL AND length(p_note) > 4000 THEN
        RAISE EXCEPTION 'note: at most 4000 characters' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v_turn FROM querylayer.console_turns WHERE id = p_turn_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no console turn % on this site', p_turn_id USING ERRCODE = 'QL404';
    END IF;
    IF v_turn.state NOT IN ('failed', 'cancelled') THEN
        RAISE EXCEPTION 'turn % is %; only a failed or cancelled turn is re-opened', p_turn_id, v_turn.state
            USING ERRCODE = 'QL422';
    END IF;
    SELECT * INTO v_conv FROM querylayer.console_conversations WHERE id = v_turn.conversation_id;
    v_problem := querylayer.conversation_problem(v_conv);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'turn % cannot be re-opened: %', p_turn_id, v_problem USING ERRCODE = 'QL422';
    END IF;
    UPDATE querylayer.console_turns
       SET state = 'queued', claimed_connection_id = NULL, claimed_session_id = NULL, claimed_at = NULL,
           ended_at = NULL, outcome = NULL, failure_reason = NULL, result = NULL, retries_used = 0
     WHERE id = v_turn.id;
    PERFORM querylayer.audit('turn.reopen'::text, v_turn.id::text,
        jsonb_build_object('was', v_turn.state, 'reason', v_turn.failure_reason, 'note', p_note));
    RETURN querylayer.turn_json(v_turn.id);
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.console_register_session, querylayer_api.console_end_session,
    querylayer_api.console_open_conversation, querylayer_api.console_add_turn, querylayer_api.console_conversation_link,
    querylayer_api.console_list_conversations, querylayer_api.console_list_turns, querylayer_api.console_get_turn,
    querylayer_api.console_cancel_plan, querylayer_api.console_cancel_turn, querylayer_api.console_reopen_turn
    TO querylayer_edge;

-- The worker's pass (querylayer_worker): on every site, tasks whose binding went while nobody
-- touched them — a connection that expired, a session or profile gone — fail closed with their
-- reason. Turns a call holds right now are left to that call and the next pass.
CREATE FUNCTION querylayer_api.worker_fail_unbound_tasks() RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site   uuid;
    v_closed jsonb := '[]';
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    FOR v_site IN SELECT id FROM querylayer.sites ORDER BY id LOOP
        PERFORM querylayer.enter_operator(v_site);
        v_closed := v_closed || querylayer.fail_unbound_tasks(v_site, NULL::uuid, false, true);
    END LOOP;
    RETURN jsonb_build_object('closed', v_closed);
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.worker_fail_unbound_tasks TO querylayer_worker;
