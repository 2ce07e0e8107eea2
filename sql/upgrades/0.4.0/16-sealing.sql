-- Issue 16 (goal 3): the writers of one site no longer queue behind its head. A chained record
-- whose writer found the head held is written with its link empty and named in ledger_pending;
-- the next holder of the head seals it (sql/020_ledger.sql, docs/ledger.md "Writers of one
-- site"). Records of earlier releases keep their links and verify as before.

CREATE SEQUENCE querylayer.ledger_pending_order AS bigint;
CREATE TABLE querylayer.ledger_pending (
    site_id    uuid NOT NULL,
    written    bigint NOT NULL DEFAULT nextval('querylayer.ledger_pending_order'),
    table_name text NOT NULL,
    record_id  uuid NOT NULL UNIQUE,
    PRIMARY KEY (site_id, written)
);
ALTER SEQUENCE querylayer.ledger_pending_order OWNED BY querylayer.ledger_pending.written;
ALTER TABLE querylayer.ledger_pending
    ADD FOREIGN KEY (site_id) REFERENCES querylayer.sites ON DELETE RESTRICT;
ALTER TABLE querylayer.ledger_pending ENABLE ROW LEVEL SECURITY;
ALTER TABLE querylayer.ledger_pending FORCE ROW LEVEL SECURITY;

-- A chained record's link may be empty while it is pending: all three columns or none. The one
-- record per number of a site's chain becomes a partial unique index (chain_seq is then no key
-- column, so sealing a record never makes a writer's foreign-key check wait).
DO $link$
DECLARE
    r      record;
    v_name name;
BEGIN
    FOR r IN SELECT table_name FROM querylayer.ledger_tables ORDER BY table_name LOOP
        SELECT c.conname INTO v_name FROM pg_catalog.pg_constraint c
         WHERE c.conrelid = r.table_name::regclass AND c.contype = 'u'
           AND (SELECT array_agg(a.attname::text ORDER BY k.o) FROM unnest(c.conkey) WITH ORDINALITY AS k(n, o)
                  JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n) = ARRAY['site_id', 'chain_seq'];
        IF v_name IS NULL THEN
            RAISE EXCEPTION '% lacks its unique (site_id, chain_seq)', r.table_name;
        END IF;
        EXECUTE format('ALTER TABLE %s ALTER COLUMN chain_seq DROP NOT NULL,
                                      ALTER COLUMN prev_sha256 DROP NOT NULL,
                                      ALTER COLUMN record_sha256 DROP NOT NULL,
                                      ADD CONSTRAINT chain_link_whole CHECK ((chain_seq IS NULL) = (prev_sha256 IS NULL)
                                                                             AND (chain_seq IS NULL) = (record_sha256 IS NULL)),
                                      DROP CONSTRAINT %I',
                       r.table_name, v_name);
        EXECUTE format('CREATE UNIQUE INDEX ON %s (site_id, chain_seq) WHERE chain_seq IS NOT NULL', r.table_name);
    END LOOP;
END
$link$;
