//! What a backend keeps of the extension's catalogs for its row triggers (the chained tables'
//! newest canonical forms, `ledger.rs`; the value limits of the limited tables, `limits.rs`), and
//! when it lets go of it. A table's entry is dropped when PostgreSQL invalidates the table's
//! relation cache entry (any DDL on it, an extension upgrade's included), and every entry is
//! dropped when one of the catalogs themselves changes: their rows change only in statements
//! that fire `querylayer.catalog_changed` (sql/020_ledger.sql, sql/150_limits.sql), which
//! invalidates the catalog's own entry in every backend, at commit (and at once in the writing
//! one).

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

thread_local! {
    static REGISTERED: Cell<bool> = const { Cell::new(false) };
    /// The relation ids of the catalogs (ledger_forms, value_limits), once looked up.
    static CATALOGS: Cell<Option<[pg_sys::Oid; 2]>> = const { Cell::new(None) };
    /// Moves at every invalidation of everything (a catalog, or all relations).
    static EPOCH: Cell<u64> = const { Cell::new(0) };
    /// Moves, per relation, at every invalidation of that relation.
    static RELATION_EPOCHS: RefCell<HashMap<pg_sys::Oid, u64>> = RefCell::new(HashMap::new());
}

#[pg_guard]
unsafe extern "C-unwind" fn on_relcache_invalidation(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    let everything = relid == pg_sys::InvalidOid || CATALOGS.get().is_none_or(|c| c.contains(&relid));
    if everything {
        EPOCH.set(EPOCH.get() + 1);
        return;
    }
    match RELATION_EPOCHS.try_with(|e| e.try_borrow_mut().map(|mut e| *e.entry(relid).or_insert(0) += 1)) {
        Ok(Ok(())) => {}
        _ => EPOCH.set(EPOCH.get() + 1),
    }
}

fn relation_epoch(relid: pg_sys::Oid) -> u64 {
    RELATION_EPOCHS.with(|e| e.borrow().get(&relid).copied().unwrap_or(0))
}

/// Registers the invalidation callback and finds the catalogs (once per backend).
fn register() {
    if !REGISTERED.get() {
        // SAFETY: a relcache callback registered for the backend's life; it only touches
        // thread-locals of this module.
        unsafe {
            pg_sys::CacheRegisterRelcacheCallback(Some(on_relcache_invalidation), pg_sys::Datum::from(0))
        };
        REGISTERED.set(true);
    }
    if CATALOGS.get().is_none() {
        let oid = |name: &str| {
            Spi::get_one_with_args::<pg_sys::Oid>(
                "SELECT pg_catalog.to_regclass($1)::pg_catalog.oid",
                &[name.into()],
            )
            .ok()
            .flatten()
            .unwrap_or(pg_sys::InvalidOid)
        };
        CATALOGS.set(Some([oid("querylayer.ledger_forms"), oid("querylayer.value_limits")]));
        EPOCH.set(EPOCH.get() + 1);
    }
}

/// Entries of type `T` kept per relation id, dropped as described at the top of this file.
pub(crate) struct Kept<T> {
    epoch: u64,
    entries: HashMap<pg_sys::Oid, (u64, T)>,
}

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Kept { epoch: u64::MAX, entries: HashMap::new() }
    }
}

impl<T: Clone> Kept<T> {
    /// The entry of `relid`, or `load`'s, kept from now on.
    pub(crate) fn get(&mut self, relid: pg_sys::Oid, load: impl FnOnce() -> T) -> T {
        match self.try_get(relid, || Ok::<T, std::convert::Infallible>(load())) {
            Ok(found) => found,
        }
    }

    /// The same for a `load` that may refuse: a refusal is not kept.
    pub(crate) fn try_get<E>(
        &mut self,
        relid: pg_sys::Oid,
        load: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        register();
        if self.epoch != EPOCH.get() {
            self.entries.clear();
            self.epoch = EPOCH.get();
        }
        let current = relation_epoch(relid);
        if let Some((at, found)) = self.entries.get(&relid) {
            if *at == current {
                return Ok(found.clone());
            }
        }
        let loaded = load()?;
        // Kept only if nothing was invalidated while it loaded (a load runs SQL, which accepts
        // invalidation messages).
        if self.epoch == EPOCH.get() && relation_epoch(relid) == current {
            self.entries.insert(relid, (current, loaded.clone()));
        }
        Ok(loaded)
    }
}

crate::spi::c_function!(
    /// `querylayer.catalog_changed()`: a statement trigger on the catalogs the row triggers keep.
    /// Invalidates the catalog's relation cache entry, so every backend drops what it kept of
    /// any catalog once this transaction commits (the writing backend at once).
    catalog_changed,
    pg_finfo_catalog_changed,
    invalidate
);

unsafe fn invalidate(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, crate::spi::Refusal> {
    let trigger = crate::spi::trigger_data(fcinfo, "catalog_changed");
    pg_sys::CacheInvalidateRelcacheByRelid((*(*trigger).tg_relation).rd_id);
    Ok(pg_sys::Datum::from(0))
}
