-- Form screening: a site reports its form submissions' screening decisions. Agents get
-- aggregate counts by day, form, decision and reason only (form_screening_metrics, site:read).
-- Payloads, contact details, actors, network markers and raw signals never leave this file's
-- tables. Raw rejected events are purged after the retention window
-- (form_rejected_retention_days). The daily aggregates are maintained on insert and never
-- decremented; rejected-event totals follow the retention window: they are reported only for
-- the days the window still covers, whether or not the purge has run.

CREATE TABLE querylayer.form_screening_events (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    form_key       text NOT NULL CHECK (form_key ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    decision       text NOT NULL CHECK (decision IN ('accepted', 'rejected', 'review')),
    reason         text NOT NULL CHECK (reason ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    occurred_at    timestamptz NOT NULL,
    payload        jsonb,
    contact        text,
    actor          text,
    network_marker text,
    raw_signals    jsonb,
    recorded_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX form_screening_events_purge ON querylayer.form_screening_events (site_id, decision, occurred_at);
SELECT querylayer.isolate_by_site('querylayer.form_screening_events'::regclass);

CREATE TABLE querylayer.form_screening_daily (
    site_id  uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    day      date NOT NULL,
    form_key text NOT NULL,
    decision text NOT NULL,
    reason   text NOT NULL,
    events   bigint NOT NULL,
    PRIMARY KEY (site_id, day, form_key, decision, reason)
);
SELECT querylayer.isolate_by_site('querylayer.form_screening_daily'::regclass);

CREATE FUNCTION querylayer.count_form_screening() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF querylayer.restoring() THEN
        RETURN NEW;  -- the daily counts are restored as they were dumped
    END IF;
    INSERT INTO querylayer.form_screening_daily (site_id, day, form_key, decision, reason, events)
    VALUES (NEW.site_id, (NEW.occurred_at AT TIME ZONE 'UTC')::date, NEW.form_key, NEW.decision, NEW.reason, 1)
    ON CONFLICT (site_id, day, form_key, decision, reason) DO UPDATE SET events = form_screening_daily.events + 1;
    RETURN NEW;
END
$$;
CREATE TRIGGER count_form_screening AFTER INSERT ON querylayer.form_screening_events
    FOR EACH ROW EXECUTE FUNCTION querylayer.count_form_screening();
ALTER TABLE querylayer.form_screening_events ENABLE ALWAYS TRIGGER count_form_screening;

-- Raw events are never edited; they are deleted only by the retention purge (rejected events
-- past the window, in an operator or worker context).
CREATE FUNCTION querylayer.form_screening_events_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'form screening events are never edited' USING ERRCODE = 'QL423';
    END IF;
    IF NOT querylayer.ctx_is_operator() OR OLD.decision <> 'rejected'
       OR OLD.occurred_at >= now() - make_interval(days => querylayer.setting_int('form_rejected_retention_days'::text)) THEN
        RAISE EXCEPTION 'form screening events leave only through the retention purge' USING ERRCODE = 'QL423';
    END IF;
    RETURN OLD;
END
$$;
SELECT querylayer.guard_rows('querylayer.form_screening_events'::regclass, 'querylayer.form_screening_events_guard'::regproc, false);
CREATE TRIGGER form_screening_daily_append BEFORE DELETE OR TRUNCATE ON querylayer.form_screening_daily
    FOR EACH STATEMENT EXECUTE FUNCTION querylayer.forbid_change();
ALTER TABLE querylayer.form_screening_daily ENABLE ALWAYS TRIGGER form_screening_daily_append;

CREATE FUNCTION querylayer.insert_form_screening(p_site_id uuid, p_events jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    e jsonb;
    n integer := 0;
BEGIN
    IF jsonb_typeof(p_events) IS DISTINCT FROM 'array' OR jsonb_array_length(p_events) NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'events: an array of 1 to 10000 events is required' USING ERRCODE = '22023';
    END IF;
    FOR e IN SELECT * FROM jsonb_array_elements(p_events) LOOP
        IF (e->>'form') IS NULL OR (e->>'form') !~ '^[a-z0-9][a-z0-9_-]{0,62}$' THEN
            RAISE EXCEPTION 'events[%].form: a form key is required', n USING ERRCODE = '22023';
        END IF;
        IF coalesce(e->>'decision', '') NOT IN ('accepted', 'rejected', 'review') THEN
            RAISE EXCEPTION 'events[%].decision must be accepted, rejected or review', n USING ERRCODE = '22023';
        END IF;
        IF (e->>'reason') IS NULL OR (e->>'reason') !~ '^[a-z0-9][a-z0-9_.-]{0,62}$' THEN
            RAISE EXCEPTION 'events[%].reason: a reason code is required', n USING ERRCODE = '22023';
        END IF;
        INSERT INTO querylayer.form_screening_events (site_id, form_key, decision, reason, occurred_at, payload, contact,
                                                      actor, network_marker, raw_signals)
        VALUES (p_site_id, e->>'form', e->>'decision', e->>'reason', coalesce((e->>'occurred_at')::timestamptz, now()),
                e->'payload', e->>'contact', e->>'actor', e->>'network_marker', e->'raw_signals');
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

-- The first UTC day whose rejected events the retention window still covers (raw rejected
-- events older than the window are purged; their day totals are no longer reported).
CREATE FUNCTION querylayer.form_rejected_since() RETURNS date
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN ((now() - make_interval(days => querylayer.setting_int('form_rejected_retention_days'::text))) AT TIME ZONE 'UTC')::date;
END
$$;

-- Aggregates only: by day, form, decision and reason, for the last p_days UTC days (today
-- included). Accepted and review totals cover those days; rejected totals only the days since
-- `rejected_since`, the bounded retention window of raw rejected events.
CREATE FUNCTION querylayer_api.form_screening_metrics(p_days integer DEFAULT 30, p_form text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_since date := querylayer.form_rejected_since();
BEGIN
    PERFORM querylayer.require_principal('site:read'::text);
    IF p_days IS NULL OR p_days NOT BETWEEN 1 AND 366 THEN
        RAISE EXCEPTION 'days must be between 1 and 366' USING ERRCODE = '22023';
    END IF;
    RETURN jsonb_build_object(
        'days', p_days,
        'rejected_raw_retention_days', querylayer.setting_int('form_rejected_retention_days'::text),
        'rejected_since', v_since,
        'counts', (SELECT coalesce(jsonb_agg(jsonb_build_object('day', d.day, 'form', d.form_key, 'decision', d.decision,
                                                               'reason', d.reason, 'count', d.events)
                                             ORDER BY d.day, d.form_key, d.decision, d.reason), '[]')
                     FROM querylayer.form_screening_daily d
                    WHERE d.site_id = querylayer.ctx_site_id()
                      AND d.day > (now() AT TIME ZONE 'UTC')::date - p_days
                      AND (d.decision <> 'rejected' OR d.day >= v_since)
                      AND (p_form IS NULL OR d.form_key = p_form)));
END
$$;

CREATE FUNCTION querylayer_api.console_report_form_screening(p_events jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin', 'editor']);
    RETURN jsonb_build_object('recorded', querylayer.insert_form_screening(querylayer.ctx_site_id(), p_events));
END
$$;

CREATE FUNCTION querylayer_api.report_form_screening(p_site text, p_events jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site querylayer.sites;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    RETURN jsonb_build_object('recorded', querylayer.insert_form_screening(v_site.id, p_events));
END
$$;

-- The scheduled retention purge (run by `querylayer worker`): deletes raw rejected events older
-- than the window on every site. Aggregates are untouched.
CREATE FUNCTION querylayer_api.purge_form_screening() RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site  uuid;
    v_n     integer;
    v_total integer := 0;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    FOR v_site IN SELECT id FROM querylayer.sites LOOP
        PERFORM querylayer.enter_operator(v_site);
        DELETE FROM querylayer.form_screening_events
         WHERE site_id = v_site AND decision = 'rejected'
           AND occurred_at < now() - make_interval(days => querylayer.setting_int('form_rejected_retention_days'::text));
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_total := v_total + v_n;
    END LOOP;
    PERFORM querylayer.enter_operator(NULL::uuid);
    PERFORM querylayer.audit('form_screening.purge'::text, NULL::text, jsonb_build_object('deleted', v_total));
    RETURN jsonb_build_object('deleted', v_total,
                              'retention_days', querylayer.setting_int('form_rejected_retention_days'::text));
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.form_screening_metrics, querylayer_api.console_report_form_screening TO querylayer_edge;
GRANT EXECUTE ON FUNCTION querylayer_api.purge_form_screening TO querylayer_worker;
