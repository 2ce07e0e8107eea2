//! In-database tests, one module per domain in the order of `sql/`, plus the helpers they share.
//! Each test runs inside one transaction that is rolled back. They try to break the invariants
//! from inside PostgreSQL: as the edge role, as the table owner, as a superuser. What needs
//! several transactions or real logins lives in the client-side tier (`tests/db/`). Ledger forms
//! and checkpoints: `ledger_tests.rs`; what keeps history through operations:
//! `durability_tests.rs`.

mod helpers;

mod console_tasks;
mod content;
mod context;
mod credentials;
mod dashboard;
mod delivery;
mod editorial;
mod envelopes;
mod evidence;
mod forms;
mod health;
mod idempotency;
mod identity;
mod jsonb;
mod ledger;
mod limits;
mod oauth;
mod proposals;
mod rate;
mod reading;
mod retention;
mod runs;
mod semantics;
mod source_packages;
