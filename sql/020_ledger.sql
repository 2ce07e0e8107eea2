-- Append-only enforcement and the per-site hash chain.
--
-- Immutable tables get BEFORE UPDATE OR DELETE row triggers and a BEFORE TRUNCATE statement
-- trigger, enabled ALWAYS so that session_replication_role = replica does not skip them. Only a
-- superuser who drops or disables the triggers gets past this, and the chain makes that visible:
-- every chained record carries the SHA-256 of its content (content_sha256), the record hash of
-- the site's previous record (prev_sha256) and its own record hash
-- record_sha256 = sha256(prev_sha256 || content_sha256); chain_seq numbers a site's records.

CREATE FUNCTION querylayer.forbid_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%.% is append-only: % is refused', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'QL423',
              HINT = 'records here are immutable; append a new record instead';
END
$$;

CREATE FUNCTION querylayer.make_append_only(p_table regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE TRIGGER append_only_row BEFORE UPDATE OR DELETE ON %s
                    FOR EACH ROW EXECUTE FUNCTION querylayer.forbid_change()', p_table);
    EXECUTE format('CREATE TRIGGER append_only_truncate BEFORE TRUNCATE ON %s
                    FOR EACH STATEMENT EXECUTE FUNCTION querylayer.forbid_change()', p_table);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER append_only_row', p_table);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER append_only_truncate', p_table);
END
$$;

-- One row per site: the newest record's number and hash.
CREATE TABLE querylayer.ledger_heads (
    site_id uuid PRIMARY KEY,
    seq     bigint NOT NULL DEFAULT 0,
    head    bytea  NOT NULL,
    prev    bytea
);

-- The chained tables, in no particular order (verification merges them by chain_seq).
CREATE TABLE querylayer.ledger_tables (
    table_name text PRIMARY KEY
);

CREATE FUNCTION querylayer.ledger_genesis(p_site uuid) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT pg_catalog.sha256(pg_catalog.convert_to('querylayer-ledger-genesis:' || p_site::text, 'UTF8'))
$$;

-- The hashed content of a record: the row as jsonb (UTC timestamps) minus the chain columns.
CREATE FUNCTION querylayer.ledger_content(p_row jsonb) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN (
    SELECT pg_catalog.sha256(pg_catalog.convert_to(
        (p_row - 'chain_seq' - 'prev_sha256' - 'content_sha256' - 'record_sha256')::text, 'UTF8')));
END
$$;

-- A site's history takes one writer at a time: its ledger_heads row. The wait for that row is
-- bounded (setting ledger_lock_timeout_ms, 5 s by default): past it the call fails with QL503, a
-- retryable "busy", so a transaction that holds one site's history cannot make the writers of
-- that site hold their connections until the statement timeout. Taken once per transaction
-- and site (the transaction-local marker only saves the second attempt; the UPDATE that follows
-- locks the row whatever the marker says).
CREATE FUNCTION querylayer.lock_ledger_head(p_site uuid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_saved   text;
    v_timeout integer;
BEGIN
    IF pg_catalog.current_setting('querylayer.ledger_head_held', true) = p_site::text THEN
        RETURN;
    END IF;
    v_saved := pg_catalog.current_setting('lock_timeout');
    v_timeout := coalesce(querylayer.setting_int('ledger_lock_timeout_ms'), 5000);
    PERFORM pg_catalog.set_config('lock_timeout', v_timeout::text, true);
    BEGIN
        PERFORM 1 FROM querylayer.ledger_heads WHERE site_id = p_site FOR NO KEY UPDATE;
    EXCEPTION WHEN lock_not_available THEN
        PERFORM pg_catalog.set_config('lock_timeout', v_saved, true);
        RAISE EXCEPTION 'the history of site % is busy: another transaction has held it for % ms', p_site, v_timeout
            USING ERRCODE = 'QL503',
                  HINT = 'retry the call shortly (with the same idempotency key); an operator finds the holder in pg_locks on querylayer.ledger_heads';
    END;
    PERFORM pg_catalog.set_config('lock_timeout', v_saved, true);
    PERFORM pg_catalog.set_config('querylayer.ledger_head_held', p_site::text, true);
END
$$;

CREATE FUNCTION querylayer.chain_append() RETURNS trigger
LANGUAGE plpgsql
SET "TimeZone" = 'UTC' SET "IntervalStyle" = 'postgres' AS $$
DECLARE
    v_content bytea;
BEGIN
    v_content := querylayer.ledger_content(to_jsonb(NEW));
    PERFORM querylayer.lock_ledger_head(NEW.site_id);
    UPDATE querylayer.ledger_heads h
       SET seq = h.seq + 1, prev = h.head, head = pg_catalog.sha256(h.head || v_content)
     WHERE h.site_id = NEW.site_id
    RETURNING h.seq, h.prev, h.head INTO NEW.chain_seq, NEW.prev_sha256, NEW.record_sha256;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'site % has no ledger', NEW.site_id USING ERRCODE = 'QL404';
    END IF;
    NEW.content_sha256 := v_content;
    RETURN NEW;
END
$$;

-- Makes a table (with site_id and id) append-only and chained: adds the four chain columns,
-- numbers each site's records uniquely, and hashes every insert.
CREATE FUNCTION querylayer.make_chained(p_table regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s
                        ADD COLUMN chain_seq bigint NOT NULL,
                        ADD COLUMN prev_sha256 bytea NOT NULL,
                        ADD COLUMN content_sha256 bytea NOT NULL,
                        ADD COLUMN record_sha256 bytea NOT NULL,
                        ADD UNIQUE (site_id, chain_seq)', p_table);
    PERFORM querylayer.make_append_only(p_table);
    -- "zz_": row triggers fire in name order, and the hash must see the final row.
    EXECUTE format('CREATE TRIGGER zz_chain BEFORE INSERT ON %s
                    FOR EACH ROW EXECUTE FUNCTION querylayer.chain_append()', p_table);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER zz_chain', p_table);
    INSERT INTO querylayer.ledger_tables (table_name)
    SELECT format('%I.%I', n.nspname, c.relname)
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = p_table;
END
$$;

-- Walks a site's chain in order and reports the first broken link, if any.
CREATE FUNCTION querylayer.verify_ledger_site(p_site uuid) RETURNS jsonb
LANGUAGE plpgsql
SET "TimeZone" = 'UTC' SET "IntervalStyle" = 'postgres' AS $$
DECLARE
    v_sql     text;
    r         record;
    v_prev    bytea  := querylayer.ledger_genesis(p_site);
    v_seq     bigint := 0;
    v_problem text;
    v_head    querylayer.ledger_heads;
BEGIN
    SELECT string_agg(format(
             'SELECT %L AS tbl, t.id::text AS id, t.chain_seq, t.prev_sha256, t.content_sha256, t.record_sha256,
                     querylayer.ledger_content(to_jsonb(t)) AS recomputed
                FROM %s t WHERE t.site_id = $1', table_name, table_name), ' UNION ALL ' ORDER BY table_name)
      INTO v_sql FROM querylayer.ledger_tables;
    FOR r IN EXECUTE v_sql || ' ORDER BY chain_seq' USING p_site LOOP
        v_problem := CASE
            WHEN r.chain_seq <> v_seq + 1 THEN format('record %s is missing or out of order', v_seq + 1)
            WHEN r.prev_sha256 IS DISTINCT FROM v_prev THEN 'prev_sha256 does not match the previous record'
            WHEN r.recomputed IS DISTINCT FROM r.content_sha256 THEN 'content does not match content_sha256 (record edited)'
            WHEN pg_catalog.sha256(v_prev || r.content_sha256) IS DISTINCT FROM r.record_sha256 THEN 'record_sha256 does not match'
        END;
        IF v_problem IS NOT NULL THEN
            RETURN jsonb_build_object('ok', false, 'checked', v_seq,
                'broken', jsonb_build_object('table', r.tbl, 'id', r.id, 'chain_seq', r.chain_seq, 'problem', v_problem));
        END IF;
        v_prev := r.record_sha256;
        v_seq := r.chain_seq;
    END LOOP;
    SELECT * INTO v_head FROM querylayer.ledger_heads WHERE site_id = p_site;
    IF v_head.seq IS DISTINCT FROM v_seq OR v_head.head IS DISTINCT FROM v_prev THEN
        RETURN jsonb_build_object('ok', false, 'checked', v_seq,
            'broken', jsonb_build_object('table', NULL, 'id', NULL, 'chain_seq', v_seq + 1,
                'problem', format('the ledger head says %s records; records after %s are missing', v_head.seq, v_seq)));
    END IF;
    RETURN jsonb_build_object('ok', true, 'checked', v_seq, 'head_sha256', encode(v_prev, 'hex'));
END
$$;

-- -------------------------------------------------------------------------------------------
-- Time partitions. The tables whose rows may age out — access records, never governed history —
-- are partitioned by month on their time column, with a default partition that catches any row
-- no month partition holds yet. A month leaves only whole, through querylayer_api.apply_retention
-- (160_retention.sql), which first leaves a signed summary of it in each site's chain.
-- Creating and dropping partitions is DDL, which querylayer_owner may not run (990_privileges.sql):
-- the extension's partition functions (extension/src/partitions.rs) build exactly these
-- statements, for the tables listed here, and the guard lets them through while they run.

CREATE TABLE querylayer.aging_tables (
    table_name  text PRIMARY KEY,   -- schema-qualified: querylayer.audit_events
    time_column text NOT NULL
);

-- The months kept ready ahead of time (the current one included).
CREATE FUNCTION querylayer.partition_months_ahead() RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT 3 $$;

-- Creates the default partition and the months from this one to partition_months_ahead()
-- months ahead, for every aging table (or one). Returns the partitions it created. A month whose
-- rows already wait in the default partition is left there (with a warning) until they age out.
CREATE FUNCTION querylayer.ensure_time_partitions(p_table text DEFAULT NULL) RETURNS text[]
LANGUAGE plpgsql SET "TimeZone" = 'UTC' AS $$
DECLARE
    r         record;
    v_month   date;
    v_name    text;
    v_created text[] := '{}';
BEGIN
    FOR r IN SELECT table_name FROM querylayer.aging_tables
              WHERE p_table IS NULL OR table_name = p_table ORDER BY table_name LOOP
        v_name := querylayer.create_time_partition(r.table_name, NULL, NULL);
        IF v_name IS NOT NULL THEN
            v_created := v_created || v_name;
        END IF;
        FOR i IN 0 .. querylayer.partition_months_ahead() LOOP
            v_month := (date_trunc('month', pg_catalog.now()) + make_interval(months => i))::date;
            BEGIN
                v_name := querylayer.create_time_partition(r.table_name, extract(year FROM v_month)::integer,
                                                           extract(month FROM v_month)::integer);
            EXCEPTION WHEN check_violation THEN
                RAISE WARNING 'rows of % for % wait in its default partition; that month gets no partition of its own',
                    r.table_name, to_char(v_month, 'YYYY-MM');
                v_name := NULL;
            END;
            IF v_name IS NOT NULL THEN
                v_created := v_created || v_name;
            END IF;
        END LOOP;
    END LOOP;
    RETURN v_created;
END
$$;

-- Registers a table partitioned by range on p_column as aging by month and creates its partitions.
CREATE FUNCTION querylayer.age_by_month(p_table regclass, p_column name) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_name text;
BEGIN
    SELECT format('%I.%I', n.nspname, c.relname) INTO v_name
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = p_table AND c.relkind = 'p';
    IF v_name IS NULL THEN
        RAISE EXCEPTION '% is not a partitioned table', p_table;
    END IF;
    INSERT INTO querylayer.aging_tables (table_name, time_column) VALUES (v_name, p_column)
    ON CONFLICT (table_name) DO NOTHING;
    PERFORM querylayer.ensure_time_partitions(v_name);
END
$$;

-- The partitions of the aging tables, with their ranges (NULL bounds: the default partition).
CREATE FUNCTION querylayer.time_partitions()
RETURNS TABLE (table_name text, partition_name text, range_from timestamptz, range_to timestamptz,
               is_default boolean, bytes bigint)
LANGUAGE plpgsql STABLE SET "TimeZone" = 'UTC' AS $$
BEGIN
    RETURN QUERY
    SELECT a.table_name, format('%I.%I', pn.nspname, p.relname),
           (regexp_match(pg_catalog.pg_get_expr(p.relpartbound, p.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz,
           (regexp_match(pg_catalog.pg_get_expr(p.relpartbound, p.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz,
           pg_catalog.pg_get_expr(p.relpartbound, p.oid) = 'DEFAULT',
           pg_catalog.pg_total_relation_size(p.oid)
      FROM querylayer.aging_tables a
      JOIN pg_catalog.pg_class c ON c.relkind = 'p'
      JOIN pg_catalog.pg_namespace cn ON cn.oid = c.relnamespace AND format('%I.%I', cn.nspname, c.relname) = a.table_name
      JOIN pg_catalog.pg_inherits i ON i.inhparent = c.oid
      JOIN pg_catalog.pg_class p ON p.oid = i.inhrelid
      JOIN pg_catalog.pg_namespace pn ON pn.oid = p.relnamespace
     ORDER BY 1, 3 NULLS FIRST;
END
$$;
