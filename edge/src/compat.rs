//! Which versions of the extension this edge speaks, and the check that the database holds one
//! of them: at start (`serve`, `mcp-serve`, `worker` refuse to run against another) and at every
//! readiness probe (`/readyz` reports both versions).

use serde_json::{json, Value};

use crate::db::Db;
use crate::error::Error;

/// This edge's version (the workspace's).
pub const EDGE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The versions of the querylayer extension whose SQL surface this edge calls. An edge calls
/// functions that earlier versions lack, so it speaks the version it was released with; after a
/// package upgrade, `ALTER EXTENSION querylayer UPDATE` brings the database to it
/// (docs/operations.md, "Version compatibility").
pub const EXTENSION_VERSIONS: &[&str] = &[EDGE_VERSION];

/// What the database holds, as far as this edge is concerned.
#[derive(Debug, PartialEq, Eq)]
pub enum Compatibility {
    Supported(String),
    Unsupported(String),
    NotInstalled,
}

impl Compatibility {
    pub fn of(installed: Option<&str>) -> Self {
        match installed {
            None => Compatibility::NotInstalled,
            Some(v) if EXTENSION_VERSIONS.contains(&v) => Compatibility::Supported(v.to_string()),
            Some(v) => Compatibility::Unsupported(v.to_string()),
        }
    }

    /// Why this edge refuses the database, for the log and for `/readyz`; None when it does not.
    pub fn refusal(&self) -> Option<String> {
        let speaks = EXTENSION_VERSIONS.join(", ");
        match self {
            Compatibility::Supported(_) => None,
            Compatibility::NotInstalled => Some(format!(
                "the querylayer extension is not installed in this database; this edge {EDGE_VERSION} \
                 speaks querylayer {speaks} (CREATE EXTENSION querylayer)"
            )),
            Compatibility::Unsupported(v) => Some(format!(
                "the database has querylayer {v}, but this edge {EDGE_VERSION} speaks querylayer {speaks}: \
                 install the matching package and run ALTER EXTENSION querylayer UPDATE, or run the \
                 edge released with {v}"
            )),
        }
    }

    /// `{"edge": …, "extension": …}` for `/readyz`.
    pub fn versions(&self) -> Value {
        let extension = match self {
            Compatibility::Supported(v) | Compatibility::Unsupported(v) => Value::String(v.clone()),
            Compatibility::NotInstalled => Value::Null,
        };
        json!({ "edge": EDGE_VERSION, "extension": extension })
    }
}

/// Asks the database which version it holds.
pub async fn check(db: &Db) -> Result<Compatibility, Error> {
    Ok(Compatibility::of(db.extension_version().await?.as_deref()))
}

/// The start-up check: Err with the reason when the database answers and holds another version
/// (or none). A database that does not answer yet is not a refusal: `/readyz` says so until it
/// does, and then checks the version too.
pub async fn require(db: &Db) -> Result<(), String> {
    match check(db).await {
        Ok(compat) => match compat.refusal() {
            Some(reason) => Err(reason),
            None => {
                tracing::info!(edge = EDGE_VERSION, extension = ?compat.versions()["extension"], "versions agree");
                Ok(())
            }
        },
        Err(e) => {
            e.log("connecting to the database");
            tracing::warn!(
                code = e.code.as_str(),
                "the database does not answer yet; /readyz says so until it does"
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_edge_speaks_its_own_release_and_refuses_others_with_the_remedy() {
        assert_eq!(Compatibility::of(Some(EDGE_VERSION)).refusal(), None);
        let older = Compatibility::of(Some("0.1.0"));
        let reason = older.refusal().unwrap();
        assert!(reason.contains("querylayer 0.1.0") && reason.contains("ALTER EXTENSION querylayer UPDATE"));
        assert_eq!(older.versions(), json!({"edge": EDGE_VERSION, "extension": "0.1.0"}));
        let missing = Compatibility::of(None);
        assert!(missing.refusal().unwrap().contains("CREATE EXTENSION querylayer"));
        assert_eq!(missing.versions()["extension"], Value::Null);
    }
}
