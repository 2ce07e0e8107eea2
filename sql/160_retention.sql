-- Retention: what may age out, and the proof of what did. Access records — audit rows (tool calls,
-- failed authentications, every action's audit line) and envelope receipts — live in month
-- partitions (020_ledger.sql) and leave a month at a time once the whole month is older than
-- audit_retention_days (90 by default). Before a month is dropped its rows are counted and
-- hashed per site, and a summary signed with the server key is appended to each site's chain
-- (retention_summaries); verify_ledger keeps passing and the summary says what was there.
-- Expired idempotency keys and spent envelope nonces are deleted. Governed history — runs,
-- revisions, proposals, decisions, executions, receipts of access decisions, answers, lineage,
-- attestations — is never deleted: none of it lives in an aging table.

-- One row per dropped partition: what it held in total, per site and without a site (failed
-- authentications, denied envelopes), signed. Append-only; operators read it.
CREATE TABLE querylayer.retention_drops (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    table_name     text NOT NULL,
    partition_name text NOT NULL,
    range_from     timestamptz,
    range_to       timestamptz,
    rows           bigint NOT NULL,
    bytes          bigint NOT NULL,
    statement      jsonb NOT NULL,
    signature      text NOT NULL,
    server_key_id  uuid NOT NULL REFERENCES querylayer.server_keys ON DELETE RESTRICT,
    dropped_by     text NOT NULL,
    dropped_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
SELECT querylayer.make_append_only('querylayer.retention_drops'::regclass);

-- The part of a drop that concerns one site, in that site's chain.
CREATE TABLE querylayer.retention_summaries (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id        uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    drop_id        uuid NOT NULL REFERENCES querylayer.retention_drops ON DELETE RESTRICT,
    statement      jsonb NOT NULL,
    signature      text NOT NULL,
    server_key_id  uuid NOT NULL REFERENCES querylayer.server_keys ON DELETE RESTRICT,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
SELECT querylayer.isolate_by_site('querylayer.retention_summaries'::regclass);
SELECT querylayer.make_chained('querylayer.retention_summaries'::regclass);

-- Counts and hashes the rows of one partition that one site (or no site: NULL) can see, in id
-- order: rows_sha256 = h_n where h_0 is 32 zero bytes and h_i = sha256(h_(i-1) || sha256(row_i)),
-- row_i being the row as jsonb text (UTC timestamps). Runs in the caller's operator context.
CREATE FUNCTION querylayer.hash_partition_rows(p_table text, p_time_column text, p_partition regclass,
                                               p_from timestamptz, p_to timestamptz, p_site uuid)
RETURNS jsonb
LANGUAGE plpgsql SET "TimeZone" = 'UTC' SET "IntervalStyle" = 'postgres' AS $$
DECLARE
    v_hash  bytea := '\x0000000000000000000000000000000000000000000000000000000000000000';
    v_rows  bigint := 0;
    v_row   text;
BEGIN
    FOR v_row IN EXECUTE format(
        'SELECT to_jsonb(t)::text FROM %s t
          WHERE t.tableoid = $1 AND t.site_id IS NOT DISTINCT FROM $2
            AND ($3::timestamptz IS NULL OR t.%I >= $3) AND ($4::timestamptz IS NULL OR t.%I < $4)
          ORDER BY t.id', p_table, p_time_column, p_time_column)
        USING p_partition, p_site, p_from, p_to LOOP
        v_hash := pg_catalog.sha256(v_hash || pg_catalog.sha256(pg_catalog.convert_to(v_row, 'UTF8')));
        v_rows := v_rows + 1;
    END LOOP;
    RETURN jsonb_build_object('rows', v_rows, 'rows_sha256', encode(v_hash, 'hex'));
END
$$;

-- Called by querylayer.drop_time_partition (extension/src/partitions.rs) right before it drops
-- p_partition, which it cannot do without this: refuses a month not wholly older than the
-- retention window (or a default partition holding a row that is not), then records the signed
-- summaries. Needs an operator context (apply_retention's). A refusal is returned, not raised
-- ({"refused", "sqlstate"}): drop_aged_partition raises it with its SQLSTATE.
CREATE FUNCTION querylayer.record_time_partition_drop(p_partition text) RETURNS jsonb
LANGUAGE plpgsql SET "TimeZone" = 'UTC' AS $$
DECLARE
    p          record;
    v_column   text;
    v_cutoff   timestamptz := pg_catalog.now() - make_interval(days => querylayer.setting_int('audit_retention_days'::text));
    v_key      querylayer.server_keys := querylayer.server_key();
    v_drop     uuid := gen_random_uuid();
    v_at       timestamptz := clock_timestamp();
    v_sites    jsonb := '[]';
    v_siteless jsonb;
    v_part     jsonb;
    v_total    bigint := 0;
    v_site     uuid;
    v_stmt     jsonb;
BEGIN
    IF NOT querylayer.ctx_is_operator() THEN
        RETURN jsonb_build_object('refused', 'operator context required', 'sqlstate', 'QL401');
    END IF;
    SELECT * INTO p FROM querylayer.time_partitions() t WHERE t.partition_name = p_partition;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('refused', format('no time partition %s', p_partition), 'sqlstate', 'QL404');
    END IF;
    SELECT time_column INTO v_column FROM querylayer.aging_tables WHERE table_name = p.table_name;
    IF NOT p.is_default AND p.range_to > v_cutoff THEN
        RETURN jsonb_build_object('sqlstate', 'QL422', 'refused',
            format('%s holds rows until %s, inside the retention window (audit_retention_days reaches back to %s)',
                   p_partition, p.range_to, v_cutoff));
    END IF;
    IF p.is_default AND NOT querylayer.default_partition_aged(p.table_name, p_partition, v_cutoff) THEN
        PERFORM querylayer.enter_operator(NULL::uuid);
        RETURN jsonb_build_object('sqlstate', 'QL422', 'refused',
            format('%s is empty or holds rows inside the retention window', p_partition));
    END IF;
    FOR v_site IN SELECT id FROM querylayer.sites ORDER BY id LOOP
        PERFORM querylayer.enter_operator(v_site);
        v_part := querylayer.hash_partition_rows(p.table_name, v_column, p_partition::regclass, p.range_from, p.range_to, v_site);
        IF (v_part->>'rows')::bigint > 0 THEN
            v_stmt := jsonb_build_object(
                'type', 'querylayer.retention-summary.v1', 'drop_id', v_drop, 'site_id', v_site,
                'table', p.table_name, 'partition', p_partition,
                'range_from', p.range_from, 'range_to', p.range_to, 'dropped_at', v_at,
                'rows', (v_part->>'rows')::bigint, 'rows_sha256', v_part->>'rows_sha256',
                'server_key', v_key.did_key);
            v_sites := v_sites || jsonb_build_array(v_stmt);
            v_total := v_total + (v_part->>'rows')::bigint;
        END IF;
    END LOOP;
    PERFORM querylayer.enter_operator(NULL::uuid);
    v_siteless := querylayer.hash_partition_rows(p.table_name, v_column, p_partition::regclass, p.range_from, p.range_to, NULL::uuid);
    v_total := v_total + (v_siteless->>'rows')::bigint;
    v_stmt := jsonb_build_object(
        'type', 'querylayer.retention-drop.v1', 'drop_id', v_drop, 'table', p.table_name,
        'partition', p_partition, 'range_from', p.range_from, 'range_to', p.range_to, 'dropped_at', v_at,
        'rows', v_total, 'bytes', p.bytes, 'server_key', v_key.did_key,
        'sites', (SELECT coalesce(jsonb_agg(jsonb_build_object('site_id', s->'site_id', 'rows', s->'rows',
                                                               'rows_sha256', s->'rows_sha256')), '[]')
                    FROM jsonb_array_elements(v_sites) AS s),
        'without_site', v_siteless);
    INSERT INTO querylayer.retention_drops (id, table_name, partition_name, range_from, range_to, rows, bytes,
                                            statement, signature, server_key_id, dropped_by, dropped_at)
    VALUES (v_drop, p.table_name, p_partition, p.range_from, p.range_to, v_total, p.bytes, v_stmt,
            querylayer.sign_statement(v_stmt, v_key.secret), v_key.id, querylayer.outer_user(), v_at);
    FOR v_stmt IN SELECT s FROM jsonb_array_elements(v_sites) AS s LOOP
        PERFORM querylayer.enter_operator((v_stmt->>'site_id')::uuid);
        INSERT INTO querylayer.retention_summaries (site_id, drop_id, statement, signature, server_key_id)
        VALUES ((v_stmt->>'site_id')::uuid, v_drop, v_stmt, querylayer.sign_statement(v_stmt, v_key.secret), v_key.id);
    END LOOP;
    PERFORM querylayer.enter_operator(NULL::uuid);
    PERFORM querylayer.audit('retention.drop'::text, p_partition,
        jsonb_build_object('rows', v_total, 'bytes', p.bytes, 'drop_id', v_drop));
    RETURN jsonb_build_object('drop_id', v_drop, 'partition', p_partition, 'rows', v_total, 'bytes', p.bytes,
                              'sites', jsonb_array_length(v_sites));
END
$$;

-- Drops one aged partition (its summaries first), raising the refusal with its SQLSTATE.
CREATE FUNCTION querylayer.drop_aged_partition(p_partition text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_result jsonb := querylayer.drop_time_partition(p_partition);
BEGIN
    IF v_result ? 'refused' THEN
        RAISE EXCEPTION '%', v_result->>'refused' USING ERRCODE = v_result->>'sqlstate';
    END IF;
    RETURN v_result;
END
$$;

-- The retention job (querylayer worker runs it; operators may too): keeps month partitions
-- ready ahead, drops every month that has aged out (with its signed summaries), and deletes
-- expired idempotency keys, spent nonces and the limits' past windows and idle buckets. Returns
-- what it did.
CREATE FUNCTION querylayer_api.apply_retention() RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_created text[];
    v_dropped jsonb := '[]';
    v_cutoff  timestamptz;
    v_keys    bigint;
    v_nonces  bigint;
    v_limits  bigint;
    p         record;
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    v_cutoff := pg_catalog.now() - make_interval(days => querylayer.setting_int('audit_retention_days'::text));
    v_created := querylayer.ensure_time_partitions();
    FOR p IN SELECT * FROM querylayer.time_partitions() t
              WHERE (NOT t.is_default AND t.range_to <= v_cutoff)
                 OR (t.is_default AND t.bytes > 0 AND querylayer.default_partition_aged(t.table_name, t.partition_name, v_cutoff))
              ORDER BY t.table_name, t.range_from NULLS LAST LOOP
        v_dropped := v_dropped || jsonb_build_array(querylayer.drop_aged_partition(p.partition_name));
        PERFORM querylayer.enter_operator(NULL::uuid);
    END LOOP;
    v_keys := querylayer.reclaim_idempotency_keys();
    DELETE FROM querylayer.envelope_nonces WHERE expires_at < clock_timestamp();
    GET DIAGNOSTICS v_nonces = ROW_COUNT;
    v_limits := querylayer.reclaim_limits();
    PERFORM querylayer.audit('retention.apply'::text, NULL::text, jsonb_build_object(
        'created', to_jsonb(v_created), 'dropped', jsonb_array_length(v_dropped),
        'idempotency_keys_deleted', v_keys, 'nonces_deleted', v_nonces, 'limit_rows_deleted', v_limits));
    RETURN jsonb_build_object('retention_days', querylayer.setting_int('audit_retention_days'::text),
                              'created', to_jsonb(v_created), 'dropped', v_dropped,
                              'idempotency_keys_deleted', v_keys, 'nonces_deleted', v_nonces,
                              'limit_rows_deleted', v_limits);
END
$$;

-- Whether a default partition holds rows and every one of them is older than p_cutoff (its rows
-- are read through the parent, site by site).
CREATE FUNCTION querylayer.default_partition_aged(p_table text, p_partition text, p_cutoff timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_column text;
    v_newest timestamptz;
    v_any    timestamptz;
    v_site   uuid;
BEGIN
    SELECT time_column INTO v_column FROM querylayer.aging_tables WHERE table_name = p_table;
    FOR v_site IN SELECT id FROM querylayer.sites UNION ALL SELECT NULL LOOP
        PERFORM querylayer.enter_operator(v_site);
        EXECUTE format('SELECT max(t.%I) FROM %s t WHERE t.tableoid = $1::regclass AND t.site_id IS NOT DISTINCT FROM $2',
                       v_column, p_table) INTO v_newest USING p_partition, v_site;
        IF v_newest >= p_cutoff THEN
            PERFORM querylayer.enter_operator(NULL::uuid);
            RETURN false;
        END IF;
        v_any := coalesce(v_any, v_newest);
    END LOOP;
    PERFORM querylayer.enter_operator(NULL::uuid);
    RETURN v_any IS NOT NULL;
END
$$;

-- The aging tables' partitions, their ranges and sizes (querylayer admin list-partitions).
CREATE FUNCTION querylayer_api.list_time_partitions()
RETURNS TABLE (table_name text, partition_name text, range_from timestamptz, range_to timestamptz,
               is_default boolean, bytes bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    RETURN QUERY SELECT * FROM querylayer.time_partitions();
END
$$;

-- What retention dropped, newest first, each with whether its signature verifies against the
-- server key that made it.
CREATE FUNCTION querylayer_api.list_retention_drops(p_limit integer DEFAULT 100)
RETURNS TABLE (drop_id uuid, table_name text, partition_name text, range_from timestamptz, range_to timestamptz,
               rows bigint, bytes bigint, dropped_by text, dropped_at timestamptz, statement jsonb,
               signature text, signature_valid boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    PERFORM querylayer.page_limit(p_limit);
    RETURN QUERY
    SELECT d.id, d.table_name, d.partition_name, d.range_from, d.range_to, d.rows, d.bytes, d.dropped_by,
           d.dropped_at, d.statement, d.signature, querylayer.statement_signature_valid(d.statement, d.signature, k.did_key)
      FROM querylayer.retention_drops d JOIN querylayer.server_keys k ON k.id = d.server_key_id
     ORDER BY d.dropped_at DESC LIMIT p_limit;
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.apply_retention TO querylayer_worker;
