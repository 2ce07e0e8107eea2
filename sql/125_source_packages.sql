-- The editorial source package ledger: agents stage packages of source records into an
-- immutable, checksummed staging ledger (SHA-256 per record and per package; an identical
-- resubmission is recognised, not stored twice). Validation is deterministic; invalid records
-- are kept with their reasons for a human to dispose of. Staging creates no content item,
-- revision, proposal or publishing job.

CREATE TABLE querylayer.content_source_packages (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    package_sha256 text NOT NULL CHECK (package_sha256 ~ '^[0-9a-f]{64}$'),
    name           text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    source         text,
    record_count   integer NOT NULL,
    invalid_count  integer NOT NULL,
    warnings       jsonb NOT NULL,
    staged_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (site_id, package_sha256)
);
SELECT querylayer.isolate_by_site('querylayer.content_source_packages'::regclass);
SELECT querylayer.make_attributed('querylayer.content_source_packages'::regclass);
SELECT querylayer.make_chained('querylayer.content_source_packages'::regclass);

CREATE TABLE querylayer.content_source_records (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id       uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    package_id    uuid NOT NULL REFERENCES querylayer.content_source_packages ON DELETE RESTRICT,
    ordinal       integer NOT NULL,
    record_sha256 text NOT NULL CHECK (record_sha256 ~ '^[0-9a-f]{64}$'),
    record        jsonb NOT NULL,
    valid         boolean NOT NULL,
    problems      jsonb NOT NULL,
    warnings      jsonb NOT NULL,
    UNIQUE (package_id, ordinal)
);
SELECT querylayer.isolate_by_site('querylayer.content_source_records'::regclass);
SELECT querylayer.make_append_only('querylayer.content_source_records'::regclass);

-- Deterministic validation of one record: {problems, warnings} (problems make it invalid).
CREATE FUNCTION querylayer.check_source_record(p_record jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN CASE WHEN jsonb_typeof(p_record) <> 'object' THEN
        jsonb_build_object('problems', jsonb_build_array('the record is not an object'), 'warnings', '[]'::jsonb)
    ELSE jsonb_build_object(
        'problems', to_jsonb(array_remove(ARRAY[
            CASE WHEN jsonb_typeof(p_record->'title') IS DISTINCT FROM 'string' OR length(p_record->>'title') NOT BETWEEN 1 AND 300
                 THEN 'title: text of 1 to 300 characters is required' END,
            CASE WHEN jsonb_typeof(p_record->'url') IS DISTINCT FROM 'string' OR (p_record->>'url') !~ '^https?://[^[:space:]]+$'
                 THEN 'url: an http(s) URL is required' END], NULL)),
        'warnings', to_jsonb(array_remove(ARRAY[
            CASE WHEN NOT p_record ? 'body' THEN 'body: missing'
                 WHEN jsonb_typeof(p_record->'body') <> 'string' OR length(p_record->>'body') < 200 THEN 'body: shorter than 200 characters' END,
            CASE WHEN NOT p_record ? 'author' THEN 'author: missing' END,
            CASE WHEN NOT p_record ? 'published_at' THEN 'published_at: missing'
                 WHEN (p_record->>'published_at') !~ '^\d{4}-\d{2}-\d{2}' THEN 'published_at: not an ISO 8601 date' END], NULL)))
    END;
END
$$;

CREATE FUNCTION querylayer.package_json(p_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT jsonb_build_object(
        'package_id', p.id, 'name', p.name, 'source', p.source, 'package_sha256', p.package_sha256,
        'record_count', p.record_count, 'invalid_count', p.invalid_count, 'warnings', p.warnings,
        'staged_at', p.staged_at, 'run_id', p.run_id,
        'records', (SELECT coalesce(jsonb_agg(jsonb_build_object('record_id', r.id, 'ordinal', r.ordinal,
                        'record_sha256', r.record_sha256, 'valid', r.valid, 'problems', r.problems, 'warnings', r.warnings)
                        ORDER BY r.ordinal), '[]')
                      FROM querylayer.content_source_records r WHERE r.package_id = p.id))
      FROM querylayer.content_source_packages p WHERE p.id = p_id);
END
$$;

CREATE FUNCTION querylayer_api.stage_content_source_package(p_run_id uuid, p_name text, p_records jsonb, p_source text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_hashes   text[];
    v_checks   jsonb[];
    v_sha      text;
    v_existing uuid;
    v_pkg      uuid;
    v_warnings jsonb;
    v_invalid  integer;
    i          integer;
BEGIN
    PERFORM querylayer.require_connection('content:write'::text);
    IF p_run_id IS NULL THEN
        RAISE EXCEPTION 'run_id is required: staging belongs to an open run of the connection' USING ERRCODE = '22023';
    END IF;
    IF p_name IS NULL OR length(p_name) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'name: 1 to 200 characters are required' USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(p_records) IS DISTINCT FROM 'array' OR jsonb_array_length(p_records) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'records: an array of 1 to 1000 records is required' USING ERRCODE = '22023';
    END IF;
    SELECT array_agg(querylayer.canonical_sha256(r) ORDER BY o), array_agg(querylayer.check_source_record(r) ORDER BY o)
      INTO v_hashes, v_checks
      FROM jsonb_array_elements(p_records) WITH ORDINALITY AS x(r, o);
    v_sha := encode(sha256(convert_to(array_to_string(v_hashes, E'\n'), 'UTF8')), 'hex');
    -- Identical stagings racing each other queue here, so the first stages the package and the
    -- others find it: the same package for all, whatever the timing. (Not INSERT … ON CONFLICT:
    -- the chain's insert trigger would advance the site's ledger for a row never stored.)
    PERFORM pg_advisory_xact_lock(hashtextextended('querylayer.source_package:' || querylayer.ctx_site_id() || ':' || v_sha, 0));
    SELECT id INTO v_existing FROM querylayer.content_source_packages
     WHERE site_id = querylayer.ctx_site_id() AND package_sha256 = v_sha;
    IF FOUND THEN
        RETURN querylayer.package_json(v_existing) || jsonb_build_object('resubmitted', true);
    END IF;
    -- Package warnings: invalid records and duplicate URLs, in record order.
    SELECT count(*) FILTER (WHERE jsonb_array_length(c->'problems') > 0) INTO v_invalid FROM unnest(v_checks) c;
    SELECT coalesce(jsonb_agg(w ORDER BY o), '[]') INTO v_warnings FROM (
        SELECT 0 AS o, format('%s of %s records are invalid and were kept for review', v_invalid, cardinality(v_hashes)) AS w
         WHERE v_invalid > 0
        UNION ALL
        SELECT min(o), format('url %s appears in records %s', u, string_agg((o - 1)::text, ', ' ORDER BY o))
          FROM jsonb_array_elements(p_records) WITH ORDINALITY AS x(r, o), LATERAL (SELECT r->>'url' AS u) y
         WHERE u IS NOT NULL GROUP BY u HAVING count(*) > 1) w;
    INSERT INTO querylayer.content_source_packages (site_id, package_sha256, name, source, record_count, invalid_count, warnings,
                                                     agent_id, connection_id, run_id)
    VALUES (querylayer.ctx_site_id(), v_sha, p_name, p_source, cardinality(v_hashes), v_invalid, v_warnings,
            querylayer.ctx_agent_id(), querylayer.ctx_connection_id(), p_run_id)
    RETURNING id INTO v_pkg;
    FOR i IN 1 .. cardinality(v_hashes) LOOP
        INSERT INTO querylayer.content_source_records (site_id, package_id, ordinal, record_sha256, record, valid, problems, warnings)
        VALUES (querylayer.ctx_site_id(), v_pkg, i - 1, v_hashes[i], p_records->(i - 1),
                jsonb_array_length(v_checks[i]->'problems') = 0, v_checks[i]->'problems', v_checks[i]->'warnings');
    END LOOP;
    PERFORM querylayer.audit('source_package.stage'::text, v_pkg::text, jsonb_build_object('records', cardinality(v_hashes), 'invalid', v_invalid));
    RETURN querylayer.package_json(v_pkg) || jsonb_build_object('resubmitted', false);
END
$$;

-- Newest first; a page of p_limit and the cursor of the next.
CREATE FUNCTION querylayer_api.list_content_source_packages(p_limit integer DEFAULT 50, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.require_principal('content:read'::text);
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('packages'::text, p_cursor);
    RETURN querylayer.page('packages'::text, 'packages'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', querylayer.page_key(p.staged_at), 'id', p.id, 'item', jsonb_build_object(
                'package_id', p.id, 'name', p.name, 'source', p.source, 'package_sha256', p.package_sha256,
                'record_count', p.record_count, 'invalid_count', p.invalid_count, 'warnings', p.warnings,
                'staged_at', p.staged_at)) ORDER BY p.staged_at DESC, p.id DESC)
          FROM (SELECT * FROM querylayer.content_source_packages x
                 WHERE x.site_id = querylayer.ctx_site_id()
                   AND (v_after.after_id IS NULL
                        OR (x.staged_at, x.id) < (v_after.after_key::timestamptz, v_after.after_id))
                 ORDER BY x.staged_at DESC, x.id DESC LIMIT p_limit + 1) p));
END
$$;

-- A package's records in staged order; a page of p_limit (at most a whole package) and the
-- cursor of the next.
CREATE FUNCTION querylayer_api.list_content_source_records(p_package_id uuid, p_valid boolean DEFAULT NULL,
                                                          p_limit integer DEFAULT 100, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.require_principal('content:read'::text);
    PERFORM querylayer.page_limit(p_limit, 1000);
    v_after := querylayer.page_after('records'::text, p_cursor);
    IF NOT EXISTS (SELECT 1 FROM querylayer.content_source_packages WHERE id = p_package_id) THEN
        RAISE EXCEPTION 'no source package % on this site', p_package_id USING ERRCODE = 'QL404';
    END IF;
    RETURN querylayer.page('records'::text, 'records'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', r.ordinal::text, 'id', r.id, 'item', jsonb_build_object(
                'record_id', r.id, 'package_id', r.package_id, 'ordinal', r.ordinal, 'record_sha256', r.record_sha256,
                'record', r.record, 'valid', r.valid, 'problems', r.problems, 'warnings', r.warnings)) ORDER BY r.ordinal, r.id)
          FROM (SELECT * FROM querylayer.content_source_records x
                 WHERE x.package_id = p_package_id AND (p_valid IS NULL OR x.valid = p_valid)
                   AND (v_after.after_id IS NULL OR (x.ordinal, x.id) > (v_after.after_key::integer, v_after.after_id))
                 ORDER BY x.ordinal, x.id LIMIT p_limit + 1) r));
END
$$;

-- Turns staged (valid) records into an inert create_content / revision proposal.
CREATE FUNCTION querylayer_api.propose_content_source_draft(p_run_id uuid, p_package_id uuid, p_record_ids uuid[],
                                                           p_content_id uuid, p_revision_id uuid, p_summary text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bad     record;
    v_first   boolean;
    v_missing uuid;
BEGIN
    PERFORM querylayer.require_connection('content:write'::text);
    IF p_record_ids IS NULL OR cardinality(p_record_ids) NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'record_ids: 1 to 100 staged record ids are required' USING ERRCODE = '22023';
    END IF;
    -- Packages and records of other sites are invisible: not found, like every foreign id.
    IF NOT EXISTS (SELECT 1 FROM querylayer.content_source_packages WHERE id = p_package_id) THEN
        RAISE EXCEPTION 'package_id: no source package % on this site', p_package_id USING ERRCODE = 'QL404';
    END IF;
    SELECT x INTO v_missing FROM unnest(p_record_ids) x
     WHERE NOT EXISTS (SELECT 1 FROM querylayer.content_source_records r WHERE r.id = x) LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'record_ids: no staged record % on this site', v_missing USING ERRCODE = 'QL404';
    END IF;
    SELECT x AS id, r.valid, r.package_id INTO v_bad
      FROM unnest(p_record_ids) x LEFT JOIN querylayer.content_source_records r ON r.id = x
     WHERE r.id IS NULL OR r.package_id <> p_package_id OR NOT r.valid LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'record_ids: % is %', v_bad.id,
            CASE WHEN v_bad.valid IS NULL THEN 'not a record of this package' ELSE 'invalid; a human must dispose of it' END
            USING ERRCODE = '22023';
    END IF;
    SELECT r.revision_number = 1 INTO v_first FROM querylayer.content_revisions r WHERE r.id = p_revision_id AND r.content_id = p_content_id;
    RETURN querylayer.propose(p_run_id, CASE WHEN coalesce(v_first, true) THEN 'create_content' ELSE 'revision' END,
        jsonb_build_object('source_package_id', p_package_id, 'source_record_ids', to_jsonb(p_record_ids),
                           'content_id', p_content_id, 'revision_id', p_revision_id), p_summary);
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.stage_content_source_package, querylayer_api.list_content_source_packages,
    querylayer_api.list_content_source_records, querylayer_api.propose_content_source_draft TO querylayer_edge;
