//! What readiness needs to know that SQL cannot see: the free space of the file systems that
//! hold the data directory and the write-ahead log (a full disk fails every write while a
//! `SELECT 1` still answers).

use crate::jsonb::Jsonb;
use pgrx::prelude::*;

use serde_json::json;

/// Free bytes available to PostgreSQL on the file system holding `path`, if it can be read.
fn free_bytes(path: &std::path::Path) -> Option<u64> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a zeroed out-parameter of the right type.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    (rc == 0).then(|| (stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

/// `{"data_free_bytes", "wal_free_bytes"}` of this cluster (NULL where unreadable).
#[pg_extern(volatile, parallel_safe)]
fn disk_free() -> Jsonb {
    // SAFETY: DataDir is set before any backend runs SQL.
    let data_dir = unsafe { std::ffi::CStr::from_ptr(pg_sys::DataDir) }.to_string_lossy().into_owned();
    let data = std::path::PathBuf::from(data_dir);
    Jsonb(json!({
        "data_free_bytes": free_bytes(&data),
        "wal_free_bytes": free_bytes(&data.join("pg_wal")),
    }))
}
