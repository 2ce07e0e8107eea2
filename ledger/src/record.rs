//! The leaf of a chained record: its sequence number in the site's chain, its table, the number
//! of its canonical form and the SHA-256 of its canonical form. The leaf is defined over what the
//! record says, never over how the chain links it (prev_sha256), so it stays the same however
//! records come to be appended.

use crate::merkle::{leaf_hash, Hash};

/// The data of a record's leaf: `querylayer-ledger-leaf-v1 <seq> <table> <form> <content hex>`.
pub fn leaf_input(seq: u64, table: &str, form: i32, content_sha256: &Hash) -> String {
    format!("querylayer-ledger-leaf-v1 {seq} {table} {form} {}", hex::encode(content_sha256))
}

/// The leaf hash of a record.
pub fn record_leaf(seq: u64, table: &str, form: i32, content_sha256: &Hash) -> Hash {
    leaf_hash(leaf_input(seq, table, form, content_sha256).as_bytes())
}

/// Is `table` a schema-qualified table name as the ledger writes it (`querylayer.runs`)?
pub fn is_table_name(table: &str) -> bool {
    let ident = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    matches!(table.split_once('.'), Some((schema, name)) if ident(schema) && ident(name))
}
