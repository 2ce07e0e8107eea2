//! The approval mark. `published_revision_id`, `archived_at`, the topical map and content briefs
//! change only while this backend executes an approved decision: their guard triggers admit the
//! change only when the mark is set, and only the Rust code below sets it — around one call of
//! `querylayer.apply_decision`, after checking that the decision is an approval of an executing
//! type, made in this transaction by the member who holds the context, and not executed yet.
//! No SQL can set it.

use crate::jsonb::Jsonb;
use pgrx::prelude::*;
use pgrx::Uuid;
use std::cell::Cell;

thread_local! {
    static MARK: Cell<Option<Uuid>> = const { Cell::new(None) };
}

/// Clears the mark when dropped, also when an error unwinds through `execute_decision`.
struct MarkGuard;

impl MarkGuard {
    fn set(decision: Uuid) -> MarkGuard {
        MARK.with(|m| m.set(Some(decision)));
        MarkGuard
    }
}

impl Drop for MarkGuard {
    fn drop(&mut self) {
        MARK.with(|m| m.set(None));
    }
}

pub fn clear() {
    MARK.with(|m| m.set(None));
}

/// The decision being executed right now, if any. Read by the pointer guard trigger.
#[pg_extern(stable, parallel_restricted)]
fn lifecycle_mark() -> Option<Uuid> {
    MARK.with(|m| m.get())
}

/// Executes an approved publish_lifecycle, content_lifecycle or topical_map decision. Returns the execution
/// record (`{status: applied | failed, detail}`).
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn execute_decision(decision: Uuid) -> Jsonb {
    let executable: Option<bool> =
        Spi::get_one_with_args("SELECT querylayer.decision_executable($1)", &[decision.into()])
            .unwrap_or_else(|e| error!("querylayer: cannot check decision {decision}: {e}"));
    if executable != Some(true) {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            "only an approval made in this transaction by the member acting now can be executed"
        );
    }
    let _mark = MarkGuard::set(decision);
    let result: Option<Jsonb> =
        Spi::get_one_with_args("SELECT querylayer.apply_decision($1)", &[decision.into()])
            .unwrap_or_else(|e| error!("querylayer: executing decision {decision} failed: {e}"));
    result.unwrap_or_else(|| error!("querylayer: executing decision {decision} returned nothing"))
}
