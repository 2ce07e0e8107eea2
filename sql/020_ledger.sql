-- Append-only enforcement and the per-site hash chain.
--
-- Immutable tables get BEFORE UPDATE OR DELETE row triggers and a BEFORE TRUNCATE statement
-- trigger, enabled ALWAYS so that session_replication_role = replica does not skip them. Only a
-- superuser who drops or disables the triggers gets past this, and the chain makes that visible:
-- every chained record carries the SHA-256 of its canonical form (content_sha256), the record
-- hash of the site's previous record (prev_sha256) and its own record hash
-- record_sha256 = sha256(prev_sha256 || content_sha256); chain_seq numbers a site's records.
--
-- A record's link (chain_seq, prev_sha256, record_sha256) is normally computed as it is inserted,
-- by the writer that holds the site's head. A writer that finds the head held by another
-- transaction does not wait for it: it records the form and content hash, leaves the link empty
-- and names the record in ledger_pending; the next holder of the head seals it (fills its link)
-- once it has committed, in the order the records were written. Sealing is the one change a
-- chained record ever takes: forbid_change admits it only under the seal mark, which only the
-- extension's Rust code sets (querylayer.ledger_seal), and only as a link filled in once. Every
-- record committed before another was written precedes it in the chain (docs/ledger.md, "Writers
-- of one site").
--
-- The canonical form of a record is versioned: ledger_forms names, per chained table, the fields
-- each form hashes, and every record says its form (ledger_form). content_sha256 is the SHA-256
-- of the UTF-8 text of the JSON object holding exactly those fields, as jsonb prints it (keys by
-- length then bytewise, ", " and ": " separators, timestamps in UTC), so adding a column opens a
-- new form and never changes how an earlier record verifies. docs/operations.md has the rules.

-- The append-only trigger, in C (extension/src/ledger.rs): refuses every UPDATE and DELETE of a
-- row and every TRUNCATE (QL423), with one exception: the sealer filling a pending record's
-- link, under the seal mark (see the top of this file), and then only an UPDATE in which the
-- three link columns go from NULL to a number, the record hash of the previous record and the
-- hash of that and the record's content hash, and every other column keeps the very value it
-- had.
CREATE FUNCTION querylayer.forbid_change() RETURNS trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'forbid_change';

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

-- A table whose rows change only as its guard allows (p_guard: a trigger function run BEFORE
-- UPDATE OR DELETE of each row, and BEFORE INSERT too with p_insert) and which is never
-- truncated, whoever asks: the triggers <table>_guard and <table>_no_truncate, enabled ALWAYS,
-- as make_append_only's are. A TRUNCATE runs no row trigger, so a guard alone would let the
-- table's owner empty the table.
CREATE FUNCTION querylayer.guard_rows(p_table regclass, p_guard regproc, p_insert boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_name text := (SELECT c.relname FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) p_table);
BEGIN
    EXECUTE format('CREATE TRIGGER %I BEFORE %sUPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s()',
                   v_name || '_guard', CASE WHEN p_insert THEN 'INSERT OR ' ELSE '' END, p_table, p_guard);
    EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION querylayer.forbid_change()',
                   v_name || '_no_truncate', p_table);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', p_table, v_name || '_guard');
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', p_table, v_name || '_no_truncate');
END
$$;

-- One row per site: the newest record's number and hash; and where its pending queue begins
-- (pending_from, below): no entry of the queue's was written by a transaction numbered lower,
-- when pending_cluster is this cluster's system identifier (pg_control_system()). Numbers of
-- another cluster (a restored dump) say nothing, and a missing one means "from the start".
CREATE TABLE querylayer.ledger_heads (
    site_id uuid PRIMARY KEY,
    seq     bigint NOT NULL DEFAULT 0,
    head    bytea  NOT NULL,
    prev    bytea,
    pending_from    bigint,
    pending_cluster bigint
);

-- The records whose link is still empty, one row each, in the order they were written
-- (querylayer.ledger_pending_order, drawn without a lock): what the next holder of the site's head
-- seals once they have committed. Operators see every site's (the worker seals them all).
--
-- Each entry also holds the number of the transaction that wrote it (xact, its top-level
-- pg_current_xact_id()), so that the holder of the head reads the queue from where it can still
-- hold anything, not from its start: a sealer that has sealed every entry it could see sets the
-- head's pending_from to the oldest transaction still running when it looked (its snapshot's
-- xmin). Every entry of a transaction numbered lower had committed by then (and was sealed) or
-- never will. The dead entries a seal leaves behind it (a queue's rows come and go; until a vacuum
-- its index keeps them) are then never walked again (docs/ledger.md, "Where the queue begins").
-- Two indexes, each entry's upkeep: the record's (the seal deletes by it) and the queue's range.
CREATE SEQUENCE querylayer.ledger_pending_order AS bigint;
CREATE TABLE querylayer.ledger_pending (
    site_id    uuid NOT NULL,
    written    bigint NOT NULL DEFAULT nextval('querylayer.ledger_pending_order'),
    table_name text NOT NULL,
    record_id  uuid PRIMARY KEY,
    xact       bigint NOT NULL DEFAULT CAST(CAST(pg_catalog.pg_current_xact_id() AS pg_catalog.text) AS pg_catalog.int8)
);
ALTER SEQUENCE querylayer.ledger_pending_order OWNED BY querylayer.ledger_pending.written;
CREATE INDEX ledger_pending_xact ON querylayer.ledger_pending (site_id, xact);

-- The chained tables, in no particular order (verification merges them by chain_seq).
CREATE TABLE querylayer.ledger_tables (
    table_name text PRIMARY KEY
);

-- The canonical forms of each chained table's records: form N hashes exactly these fields (sorted
-- names). A form is never changed once registered; a new column opens the next form.
CREATE TABLE querylayer.ledger_forms (
    table_name text NOT NULL REFERENCES querylayer.ledger_tables ON DELETE RESTRICT,
    form       smallint NOT NULL CHECK (form > 0),
    fields     text[] NOT NULL CHECK (cardinality(fields) > 0),
    PRIMARY KEY (table_name, form)
);
SELECT querylayer.make_append_only('querylayer.ledger_forms'::regclass);

-- The row triggers in C keep what they read of the extension's catalogs (ledger_forms here,
-- value_limits in 150_limits.sql) in each backend; every statement that writes a catalog makes
-- every backend let go of it at commit (extension/src/catalogs.rs).
CREATE FUNCTION querylayer.catalog_changed() RETURNS trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'catalog_changed';
CREATE TRIGGER zz_catalog_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON querylayer.ledger_forms
    FOR EACH STATEMENT EXECUTE FUNCTION querylayer.catalog_changed();
ALTER TABLE querylayer.ledger_forms ENABLE ALWAYS TRIGGER zz_catalog_changed;

-- The extension's catalogs: tables whose rows every install writes alike, from its own version
-- (install and upgrade scripts change them, nothing else); and the liveness generation with its
-- sequence (sql/010_context.sql), which only the backends of this one database read: a restored
-- database starts a generation of its own. Every other table holds data and is dumped by pg_dump
-- (990_privileges.sql).
CREATE FUNCTION querylayer.catalog_tables() RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN ARRAY['aging_tables', 'envelope_routes', 'ledger_forms', 'ledger_tables', 'liveness_generation',
                 'liveness_generations', 'proposal_types', 'scopes', 'task_operations', 'value_limits'];
END
$$;

-- The columns make_chained adds: the chain itself and the record's form. No form hashes them.
CREATE FUNCTION querylayer.ledger_chain_columns() RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN ARRAY['chain_seq', 'content_sha256', 'ledger_form', 'prev_sha256', 'record_sha256'];
END
$$;

-- A restore (docs/operations.md): pg_restore as a superuser with session_replication_role =
-- replica. Only then do the insert guards of history tables take rows as they were dumped (the
-- chain columns included); verify_ledger then proves the restored chain against its heads.
-- session_replication_role alone is not enough (PostgreSQL 15 lets a superuser GRANT SET on it),
-- and a governed function runs as querylayer_owner, so it never counts as restoring.
CREATE FUNCTION querylayer.restoring() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF pg_catalog.current_setting('session_replication_role') <> 'replica' THEN
        RETURN false;
    END IF;
    RETURN coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user), false);
END
$$;

CREATE FUNCTION querylayer.ledger_genesis(p_site uuid) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN pg_catalog.sha256(pg_catalog.convert_to('querylayer-ledger-genesis:' || p_site::text, 'UTF8'));
END
$$;

-- The hashed content of a record: its fields p_fields (the row as jsonb, UTC timestamps),
-- printed as jsonb prints an object.
CREATE FUNCTION querylayer.ledger_content(p_row jsonb, p_fields text[]) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN pg_catalog.sha256(pg_catalog.convert_to(
        (p_row - ARRAY(SELECT k FROM pg_catalog.jsonb_object_keys(p_row) AS k WHERE NOT (k = ANY (p_fields))))::text,
        'UTF8'));
END
$$;

-- The newest form of a chained table ('schema.table').
CREATE FUNCTION querylayer.newest_ledger_form(p_table text) RETURNS querylayer.ledger_forms
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v querylayer.ledger_forms;
BEGIN
    SELECT * INTO v FROM querylayer.ledger_forms f WHERE f.table_name = p_table ORDER BY f.form DESC LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION '% has no ledger form', p_table USING ERRCODE = 'QL422',
            HINT = 'make_chained registers form 1; querylayer.add_ledger_form registers the next';
    END IF;
    RETURN v;
END
$$;

-- A site's head (its ledger_heads row) has one holder at a time. Writers never wait for it (a
-- writer that finds it held leaves its record pending, chain_append); a sealer that must seal now
-- (a checkpoint, seal_ledger) waits, bounded by the setting ledger_lock_timeout_ms (5 s by
-- default): past it the call fails with QL503, a retryable "busy", so a transaction that holds one
-- site's history cannot hold the sealer's connection until the statement timeout. An uncontended
-- row (or one this transaction already holds) is taken at once, without the subtransaction the
-- bounded wait needs to turn a lock timeout into QL503.
CREATE FUNCTION querylayer.lock_ledger_head(p_site uuid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_saved   text;
    v_timeout integer;
BEGIN
    PERFORM 1 FROM querylayer.ledger_heads WHERE site_id = p_site FOR NO KEY UPDATE SKIP LOCKED;
    IF FOUND THEN
        RETURN;
    END IF;
    v_saved := pg_catalog.current_setting('lock_timeout');
    v_timeout := coalesce(querylayer.setting_int('ledger_lock_timeout_ms'::text), 5000);
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
END
$$;

-- The insert trigger of every chained table, in C (extension/src/chain.rs): for each record the
-- newest form of its table (kept in the backend), the content hash of its canonical form, and
-- then, if nobody else holds the site's head (this transaction may already), the sealing of what
-- others left pending and have committed, and this record's link; else the record is written
-- pending, its link empty, named in ledger_pending. The canonical form is the text of
-- (to_jsonb(row) - the columns the form does not hash) under TimeZone UTC, IntervalStyle
-- postgres, bytea_output hex and extra_float_digits 1, in UTF-8, as querylayer.ledger_content
-- computes it. A restored record (querylayer.restoring()) keeps the chain it was dumped with and
-- must carry it whole and linked; verify_ledger proves it.
CREATE FUNCTION querylayer.chain_append() RETURNS trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'chain_append';

-- The most pending records one seal pass takes (a writer holding the head seals at most this
-- many before its own record; the worker and seal_ledger take batch after batch).
CREATE FUNCTION querylayer.seal_batch() RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN 1000;
END
$$;

-- Seals at most p_max of p_site's committed pending records now (querylayer.ledger_seal, in the
-- extension's Rust: in the order they were written, each takes the next number of the site's
-- chain and links to the record before it, and the head moves once; the caller holds the head,
-- and a record removed behind the triggers is passed over and named as missing). With
-- p_strict, refuses a pending entry whose record is gone (QLL09): checkpoints and seal_ledger are
-- never made over a broken ledger. Returns how many it sealed.
CREATE FUNCTION querylayer.seal_now(p_site uuid, p_max integer, p_strict boolean DEFAULT true) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v jsonb := querylayer.ledger_seal(p_site, p_max);
BEGIN
    IF p_strict AND v->'missing' <> 'null'::jsonb THEN
        RAISE EXCEPTION 'site %: the pending record % of % is not there to seal', p_site, v->'missing'->>'id', v->'missing'->>'table'
            USING ERRCODE = 'QLL09', HINT = 'run querylayer ledger verify against the witnesses to see what changed';
    END IF;
    RETURN (v->>'sealed')::integer;
END
$$;

-- Seals every committed pending record of p_site now, batch after batch: takes the site's head
-- with the bounded wait of lock_ledger_head (QL503 past it). For checkpoints and seal_ledger.
-- Returns how many it sealed.
CREATE FUNCTION querylayer.seal_site(p_site uuid) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_n     integer;
    v_total bigint := 0;
BEGIN
    PERFORM querylayer.lock_ledger_head(p_site);
    LOOP
        v_n := querylayer.seal_now(p_site, querylayer.seal_batch());
        v_total := v_total + v_n;
        EXIT WHEN v_n < querylayer.seal_batch();
    END LOOP;
    RETURN v_total;
END
$$;

-- Registers the next canonical form of a chained table: p_fields, or by default every column of
-- the table but the chain columns. Called by make_chained (form 1) and after each column added to
-- a chained table (in sql/, right after the ALTER TABLE; docs/operations.md, "Schema changes").
-- Returns the new form's number.
CREATE FUNCTION querylayer.add_ledger_form(p_table regclass, p_fields text[] DEFAULT NULL) RETURNS smallint
LANGUAGE plpgsql AS $$
DECLARE
    v_table   text;
    v_columns text[];
    v_fields  text[];
    v_bad     text[];
    v_last    querylayer.ledger_forms;
BEGIN
    SELECT format('%I.%I', n.nspname, c.relname) INTO v_table
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = p_table;
    IF NOT EXISTS (SELECT 1 FROM querylayer.ledger_tables WHERE table_name = v_table) THEN
        RAISE EXCEPTION '% is not chained', v_table USING ERRCODE = '22023', HINT = 'call querylayer.make_chained first';
    END IF;
    SELECT array_agg(a.attname::text ORDER BY a.attname::text COLLATE "C") INTO v_columns
      FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = p_table AND a.attnum > 0 AND NOT a.attisdropped
       AND NOT (a.attname::text = ANY (querylayer.ledger_chain_columns()));
    v_fields := ARRAY(SELECT DISTINCT f COLLATE "C" FROM unnest(coalesce(p_fields, v_columns)) AS f ORDER BY 1);
    v_bad := ARRAY(SELECT f FROM unnest(v_fields) AS f WHERE NOT (f = ANY (v_columns)) ORDER BY f COLLATE "C");
    IF cardinality(v_bad) > 0 THEN
        RAISE EXCEPTION 'not a hashable column of %: %', v_table, array_to_string(v_bad, ', ') USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v_last FROM querylayer.ledger_forms WHERE table_name = v_table ORDER BY form DESC LIMIT 1;
    IF FOUND AND v_last.fields = v_fields THEN
        RAISE EXCEPTION 'form % of % already hashes these fields', v_last.form, v_table USING ERRCODE = '22023';
    END IF;
    INSERT INTO querylayer.ledger_forms (table_name, form, fields)
    VALUES (v_table, coalesce(v_last.form, 0) + 1, v_fields)
    RETURNING form INTO v_last.form;
    RETURN v_last.form;
END
$$;

-- The upgrade scripts' half of the registry (scripts/upgrade-script): makes sure a database
-- holds form p_form of p_table exactly as a fresh install registers it, and refuses a database
-- whose form of that number hashes other fields.
CREATE FUNCTION querylayer.ensure_ledger_form(p_table text, p_form smallint, p_fields text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_fields text[];
BEGIN
    INSERT INTO querylayer.ledger_tables (table_name) VALUES (p_table) ON CONFLICT DO NOTHING;
    SELECT fields INTO v_fields FROM querylayer.ledger_forms WHERE table_name = p_table AND form = p_form;
    IF NOT FOUND THEN
        INSERT INTO querylayer.ledger_forms (table_name, form, fields) VALUES (p_table, p_form, p_fields);
    ELSIF v_fields <> p_fields THEN
        RAISE EXCEPTION 'form % of % hashes {%} here, but {%} in a fresh install', p_form, p_table,
            array_to_string(v_fields, ','), array_to_string(p_fields, ',')
            USING ERRCODE = 'QL422',
                  HINT = 'a registered form never changes: add columns after make_chained and register the next form';
    END IF;
END
$$;

-- Makes a table (with site_id and id) append-only and chained: adds the chain columns (the link
-- empty, all three columns, while the record is pending), numbers each site's records uniquely,
-- hashes every insert, and registers form 1 (every other column).
CREATE FUNCTION querylayer.make_chained(p_table regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                    WHERE a.attrelid = p_table AND a.attname = 'id' AND a.atttypid = 'uuid'::regtype AND NOT a.attisdropped) THEN
        RAISE EXCEPTION '% needs an id of type uuid to be chained (ledger_pending names records by it)', p_table
            USING ERRCODE = '22023';
    END IF;
    EXECUTE format('ALTER TABLE %s
                        ADD COLUMN chain_seq bigint,
                        ADD COLUMN prev_sha256 bytea,
                        ADD COLUMN content_sha256 bytea NOT NULL,
                        ADD COLUMN record_sha256 bytea,
                        ADD COLUMN ledger_form smallint NOT NULL,
                        ADD CONSTRAINT chain_link_whole CHECK ((chain_seq IS NULL) = (prev_sha256 IS NULL)
                                                               AND (chain_seq IS NULL) = (record_sha256 IS NULL))', p_table);
    -- One record per number of a site's chain. Partial, so that chain_seq is not a key column:
    -- sealing a record then locks its row FOR NO KEY UPDATE, which the foreign-key checks of
    -- writers that name the record (FOR KEY SHARE) do not wait for.
    EXECUTE format('CREATE UNIQUE INDEX ON %s (site_id, chain_seq) WHERE chain_seq IS NOT NULL', p_table);
    PERFORM querylayer.make_append_only(p_table);
    -- "zz_": row triggers fire in name order, and the hash must see the final row.
    EXECUTE format('CREATE TRIGGER zz_chain BEFORE INSERT ON %s
                    FOR EACH ROW EXECUTE FUNCTION querylayer.chain_append()', p_table);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER zz_chain', p_table);
    INSERT INTO querylayer.ledger_tables (table_name)
    SELECT format('%I.%I', n.nspname, c.relname)
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = p_table;
    PERFORM querylayer.add_ledger_form(p_table);
END
$$;

-- Walks a site's chain in order and reports the first broken link, if any. Each record is read
-- by its own form. Pending records (their link still empty, committed but not yet sealed) follow
-- the chain: each must match its content hash and be named in ledger_pending, and every entry
-- there must name one of them; they are counted as "pending".
CREATE FUNCTION querylayer.verify_ledger_site(p_site uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE  -- one snapshot for every statement: the records, the entries and the head agree
SET "TimeZone" = 'UTC' SET "IntervalStyle" = 'postgres' SET bytea_output = 'hex' SET extra_float_digits = 1 AS $$
DECLARE
    v_sql     text;
    r         record;
    v_prev    bytea  := querylayer.ledger_genesis(p_site);
    v_seq     bigint := 0;
    v_pending bigint := 0;
    v_entries bigint;
    v_problem text;
    v_head    querylayer.ledger_heads;
BEGIN
    SELECT string_agg(format(
             'SELECT %L AS tbl, t.id::text AS id, t.chain_seq, t.prev_sha256, t.content_sha256, t.record_sha256,
                     t.ledger_form, f.form IS NOT NULL AS known_form,
                     querylayer.ledger_content(to_jsonb(t), f.fields) AS recomputed, p.written
                FROM %s t LEFT JOIN querylayer.ledger_forms f ON f.table_name = %L AND f.form = t.ledger_form
                LEFT JOIN querylayer.ledger_pending p ON p.record_id = t.id AND p.site_id = t.site_id
               WHERE t.site_id = $1', table_name, table_name, table_name), ' UNION ALL ' ORDER BY table_name)
      INTO v_sql FROM querylayer.ledger_tables;
    FOR r IN EXECUTE v_sql || ' ORDER BY chain_seq NULLS LAST, written' USING p_site LOOP
        IF r.chain_seq IS NULL THEN
            v_problem := CASE
                WHEN r.written IS NULL THEN 'the record is not in the chain and waits for no seal (its ledger_pending entry is gone)'
                WHEN NOT r.known_form THEN format('unknown ledger form %s', r.ledger_form)
                WHEN r.recomputed IS DISTINCT FROM r.content_sha256 THEN 'content does not match content_sha256 (record edited)'
            END;
            v_pending := v_pending + 1;
        ELSE
            v_problem := CASE
                WHEN r.chain_seq <> v_seq + 1 THEN format('record %s is missing or out of order', v_seq + 1)
                WHEN r.prev_sha256 IS DISTINCT FROM v_prev THEN 'prev_sha256 does not match the previous record'
                WHEN NOT r.known_form THEN format('unknown ledger form %s', r.ledger_form)
                WHEN r.recomputed IS DISTINCT FROM r.content_sha256 THEN 'content does not match content_sha256 (record edited)'
                WHEN pg_catalog.sha256(v_prev || r.content_sha256) IS DISTINCT FROM r.record_sha256 THEN 'record_sha256 does not match'
                WHEN r.written IS NOT NULL THEN 'the record is sealed but still named as pending'
            END;
        END IF;
        IF v_problem IS NOT NULL THEN
            RETURN jsonb_build_object('ok', false, 'checked', v_seq, 'pending', v_pending,
                'broken', jsonb_build_object('table', r.tbl, 'id', r.id, 'chain_seq', coalesce(r.chain_seq, v_seq + 1), 'problem', v_problem));
        END IF;
        IF r.chain_seq IS NOT NULL THEN
            v_prev := r.record_sha256;
            v_seq := r.chain_seq;
        END IF;
    END LOOP;
    SELECT count(*) INTO v_entries FROM querylayer.ledger_pending WHERE site_id = p_site;
    IF v_entries <> v_pending THEN
        RETURN jsonb_build_object('ok', false, 'checked', v_seq, 'pending', v_pending,
            'broken', jsonb_build_object('table', NULL, 'id', NULL, 'chain_seq', v_seq + 1,
                'problem', format('%s records wait to be sealed, but ledger_pending names %s: a pending record is missing', v_pending, v_entries)));
    END IF;
    SELECT * INTO v_head FROM querylayer.ledger_heads WHERE site_id = p_site;
    IF v_head.seq IS DISTINCT FROM v_seq OR v_head.head IS DISTINCT FROM v_prev THEN
        RETURN jsonb_build_object('ok', false, 'checked', v_seq, 'pending', v_pending,
            'broken', jsonb_build_object('table', NULL, 'id', NULL, 'chain_seq', v_seq + 1,
                'problem', format('the ledger head says %s records; records after %s are missing', v_head.seq, v_seq)));
    END IF;
    RETURN jsonb_build_object('ok', true, 'checked', v_seq, 'pending', v_pending, 'head_sha256', encode(v_prev, 'hex'));
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
    time_column text NOT NULL,
    -- Keys and indexes live on each partition, not on the partitioned table: a restore
    -- (docs/operations.md) attaches the dumped partitions, with their own keys and indexes, to
    -- the table CREATE EXTENSION made, which must have none for them to collide with.
    primary_key text[] NOT NULL,    -- its columns, e.g. {id,at}
    indexes     text[] NOT NULL DEFAULT '{}'  -- each a column list, e.g. 'site_id, at'
);

-- The months kept ready ahead of time (the current one included).
CREATE FUNCTION querylayer.partition_months_ahead() RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN 3;
END
$$;

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
        v_name := querylayer.create_time_partition(r.table_name, NULL::integer, NULL::integer);
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

-- Registers a table partitioned by range on p_column as aging by month and creates its
-- partitions, each with the primary key p_primary_key and the indexes p_indexes (column lists).
CREATE FUNCTION querylayer.age_by_month(p_table regclass, p_column name, p_primary_key text[],
                                        p_indexes text[] DEFAULT '{}') RETURNS void
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
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = p_table) THEN
        RAISE EXCEPTION '% has keys or indexes of its own; a table that ages by month keeps them on its partitions', p_table
            USING HINT = 'give them to age_by_month: a restore attaches dumped partitions, which carry their own';
    END IF;
    INSERT INTO querylayer.aging_tables (table_name, time_column, primary_key, indexes)
    VALUES (v_name, p_column, p_primary_key, coalesce(p_indexes, '{}'))
    ON CONFLICT (table_name) DO NOTHING;
    -- A restore (docs/operations.md) runs CREATE EXTENSION and then brings back the partitions
    -- the dump holds, each month as it was: creating any here would collide with them. The
    -- worker's maintenance (ensure_time_partitions) adds the months ahead afterwards.
    IF querylayer.restoring() THEN
        RETURN;
    END IF;
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
