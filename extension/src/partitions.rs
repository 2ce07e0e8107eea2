//! Time partitions of the tables whose rows may age out (`querylayer.aging_tables`,
//! sql/020_ledger.sql): the only DDL `querylayer_owner` ever runs. Each function here builds its
//! own statements for a registered table; the owner's DDL guard (sql/990_privileges.sql) lets DDL
//! through only while one of them runs, and a partition is dropped only after its signed
//! summary has been recorded (sql/160_retention.sql).

use crate::jsonb::Jsonb;
use pgrx::prelude::*;

use std::cell::Cell;

thread_local! {
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
}

/// Lets the owner's DDL through while alive. A guard, so an error (which unwinds) ends it too;
/// the transaction callbacks clear it as well (`clear`).
struct Maintenance;

impl Maintenance {
    fn begin() -> Self {
        ACTIVE.with(|a| a.set(true));
        Maintenance
    }
}

impl Drop for Maintenance {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(false));
    }
}

pub fn clear() {
    ACTIVE.with(|a| a.set(false));
}

/// True only while a function of this module runs its own statements (read by the DDL guard).
#[pg_extern(stable, parallel_restricted)]
fn partition_maintenance_active() -> bool {
    ACTIVE.with(|a| a.get())
}

/// The identifiers this module writes into statements are its own tables' names; anything else
/// is refused rather than quoted.
fn plain_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.as_bytes()[0].is_ascii_lowercase()
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// A registered aging table: its schema and name, and the primary key and indexes (column lists)
/// each of its partitions gets.
struct AgingTable {
    schema: String,
    table: String,
    primary_key: Vec<String>,
    indexes: Vec<Vec<String>>,
}

/// A column list of the registry (`'site_id, at'`), each name a plain identifier.
fn columns(list: &str) -> Option<Vec<String>> {
    let names: Vec<String> = list.split(',').map(|c| c.trim().to_string()).collect();
    names.iter().all(|c| plain_identifier(c)).then_some(names)
}

fn aging_table(name: &str) -> AgingTable {
    let found = Spi::connect(|client| {
        let row = client
            .select(
                "SELECT n.nspname::text, c.relname::text, a.primary_key, a.indexes
                   FROM querylayer.aging_tables a
                   JOIN pg_catalog.pg_class c ON c.relkind = 'p'
                   JOIN pg_catalog.pg_namespace n
                     ON n.oid = c.relnamespace AND format('%I.%I', n.nspname, c.relname) = a.table_name
                  WHERE a.table_name = $1",
                Some(1),
                &[name.into()],
            )?
            .first();
        Ok::<_, pgrx::spi::Error>((
            row.get::<String>(1)?,
            row.get::<String>(2)?,
            row.get::<Vec<String>>(3)?,
            row.get::<Vec<String>>(4)?,
        ))
    });
    match found {
        Ok((Some(schema), Some(table), Some(primary_key), Some(indexes)))
            if plain_identifier(&schema)
                && plain_identifier(&table)
                && primary_key.iter().all(|c| plain_identifier(c)) =>
        {
            let indexes: Option<Vec<Vec<String>>> = indexes.iter().map(|i| columns(i)).collect();
            match indexes {
                Some(indexes) => AgingTable { schema, table, primary_key, indexes },
                None => {
                    error!("querylayer: an index of {name} names a column that is not a plain identifier")
                }
            }
        }
        _ => error!("querylayer: {name} is not a table that ages by month"),
    }
}

/// Runs `statements` with DDL allowed and lock waits bounded (a partition's DDL waits for the
/// parent's writers; the writers queued behind it must not wait long).
fn run_ddl(statements: &[String]) {
    let saved = Spi::get_one::<String>("SELECT pg_catalog.current_setting('lock_timeout')")
        .ok()
        .flatten()
        .unwrap_or_else(|| "0".to_string());
    let _allowed = Maintenance::begin();
    Spi::run("SELECT pg_catalog.set_config('lock_timeout', '2000', true)")
        .unwrap_or_else(|e| error!("querylayer: {e}"));
    for statement in statements {
        Spi::run(statement).unwrap_or_else(|e| error!("querylayer: partition maintenance failed: {e}"));
    }
    Spi::run_with_args("SELECT pg_catalog.set_config('lock_timeout', $1, true)", &[saved.into()])
        .unwrap_or_else(|e| error!("querylayer: {e}"));
}

/// Creates the partition of `parent` for one month (`year`, `month`, UTC), or its default
/// partition (both NULL). Returns its name, or NULL when it exists already. Partitions are
/// append-only like their parent (its row triggers are cloned; the TRUNCATE guard is added),
/// and force row-level security with no policy of their own: rows are read through the parent.
#[pg_extern(volatile, parallel_unsafe)]
fn create_time_partition(parent: &str, year: Option<i32>, month: Option<i32>) -> Option<String> {
    let AgingTable { schema, table, primary_key, indexes } = aging_table(parent);
    let (name, bound) = match (year, month) {
        (None, None) => (format!("{table}_default"), "DEFAULT".to_string()),
        (Some(y), Some(m)) if (2000..=9998).contains(&y) && (1..=12).contains(&m) => {
            let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            (
                format!("{table}_p{y:04}{m:02}"),
                format!(
                    "FOR VALUES FROM ('{y:04}-{m:02}-01 00:00:00+00') TO ('{ny:04}-{nm:02}-01 00:00:00+00')"
                ),
            )
        }
        _ => {
            error!("querylayer: a time partition is one month (a year and a month) or the default (neither)")
        }
    };
    if !plain_identifier(&name) {
        error!("querylayer: the partition name {name} is too long");
    }
    let qualified = format!("{schema}.{name}");
    let exists = Spi::get_one_with_args::<bool>(
        "SELECT pg_catalog.to_regclass($1) IS NOT NULL",
        &[qualified.clone().into()],
    )
    .ok()
    .flatten()
    .unwrap_or(false);
    if exists {
        return None;
    }
    let mut statements = vec![format!("CREATE TABLE {qualified} PARTITION OF {schema}.{table} {bound}")];
    // The keys and indexes are the partition's own (the partitioned table has none, so that a
    // restore can attach dumped partitions): named as PostgreSQL names them.
    if !primary_key.is_empty() {
        statements.push(format!("ALTER TABLE {qualified} ADD PRIMARY KEY ({})", primary_key.join(", ")));
    }
    for index in &indexes {
        let index_name = format!("{name}_{}_idx", index.join("_"));
        if !plain_identifier(&index_name) {
            error!("querylayer: the index name {index_name} is too long");
        }
        statements.push(format!("CREATE INDEX {index_name} ON {qualified} ({})", index.join(", ")));
    }
    statements.extend([
        format!("ALTER TABLE {qualified} ENABLE ROW LEVEL SECURITY"),
        format!("ALTER TABLE {qualified} FORCE ROW LEVEL SECURITY"),
        format!(
            "CREATE TRIGGER append_only_truncate BEFORE TRUNCATE ON {qualified} \
             FOR EACH STATEMENT EXECUTE FUNCTION querylayer.forbid_change()"
        ),
    ]);
    // At install and upgrade a superuser runs this; the owner role owns every table.
    let superuser = unsafe { pg_sys::superuser() };
    if superuser {
        statements.push(format!("ALTER TABLE {qualified} OWNER TO querylayer_owner"));
    }
    run_ddl(&statements);
    // What an extension script creates belongs to the extension and could never be dropped on
    // its own; a partition is data that ages out, so it is let go (pg_dump then keeps its rows).
    let member = Spi::get_one_with_args::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_depend
                         WHERE classid = 'pg_catalog.pg_class'::regclass
                           AND objid = pg_catalog.to_regclass($1) AND deptype = 'e')",
        &[qualified.clone().into()],
    )
    .ok()
    .flatten()
    .unwrap_or(false);
    if member && superuser {
        run_ddl(&[format!("ALTER EXTENSION querylayer DROP TABLE {qualified}")]);
    }
    // The row triggers cloned from the parent, like the parent's, fire in replica mode too.
    let triggers = Spi::connect(|client| {
        client
            .select(
                "SELECT tgname::text FROM pg_catalog.pg_trigger
                  WHERE tgrelid = pg_catalog.to_regclass($1) AND NOT tgisinternal ORDER BY tgname",
                None,
                &[qualified.clone().into()],
            )?
            .map(|row| row.get::<String>(1))
            .collect::<Result<Vec<_>, _>>()
    })
    .unwrap_or_else(|e| error!("querylayer: {e}"));
    let enable: Vec<String> = triggers
        .into_iter()
        .flatten()
        .filter(|t| plain_identifier(t))
        .map(|t| format!("ALTER TABLE {qualified} ENABLE ALWAYS TRIGGER {t}"))
        .collect();
    run_ddl(&enable);
    Some(qualified)
}

/// Drops one partition of an aging table after recording its signed summary
/// (`querylayer.record_time_partition_drop`). When that refuses (a month that has not aged out,
/// no operator context), nothing is dropped and the refusal is returned as
/// `{"refused", "sqlstate"}` for `querylayer.drop_aged_partition` to raise: QueryLayer's own
/// SQLSTATEs do not survive a trip through Rust. A dropped default partition is created again,
/// empty. Returns the summary.
#[pg_extern(volatile, parallel_unsafe)]
fn drop_time_partition(partition: &str) -> Jsonb {
    let found = Spi::get_three_with_args::<String, String, String>(
        "SELECT a.table_name, n.nspname::text, p.relname::text
           FROM pg_catalog.pg_class p
           JOIN pg_catalog.pg_namespace n ON n.oid = p.relnamespace
           JOIN pg_catalog.pg_inherits i ON i.inhrelid = p.oid
           JOIN pg_catalog.pg_class c ON c.oid = i.inhparent
           JOIN pg_catalog.pg_namespace cn ON cn.oid = c.relnamespace
           JOIN querylayer.aging_tables a ON a.table_name = format('%I.%I', cn.nspname, c.relname)
          WHERE format('%I.%I', n.nspname, p.relname) = $1",
        &[partition.into()],
    );
    let (parent, schema, name) = match found {
        Ok((Some(parent), Some(schema), Some(name)))
            if plain_identifier(&schema) && plain_identifier(&name) =>
        {
            (parent, schema, name)
        }
        _ => error!("querylayer: {partition} is not a partition of a table that ages by month"),
    };
    let summary = Spi::get_one_with_args::<Jsonb>(
        "SELECT querylayer.record_time_partition_drop($1)",
        &[partition.into()],
    )
    .unwrap_or_else(|e| error!("querylayer: {e}"))
    .unwrap_or_else(|| error!("querylayer: no summary was recorded for {partition}"));
    if summary.0.get("refused").is_some() {
        return summary;
    }
    run_ddl(&[format!("DROP TABLE {schema}.{name}")]);
    if name.ends_with("_default") {
        create_time_partition(&parent, None, None);
    }
    summary
}
