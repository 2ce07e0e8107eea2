//! Delivery authentication: a website reads one site's published content either with that
//! site's delivery token or, when the site's owner made delivery public, with no credential at
//! all. Either way the transaction then holds a delivery context, which only the delivery
//! functions of sql/180_delivery.sql serve: it can read nothing else.

use crate::jsonb::Jsonb;
use pgrx::prelude::*;
use pgrx::Uuid;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::context::{self, Credential, Resolution};

/// The key of a public site's settings row (the SQL side computes the same).
fn public_site_key(site: &str) -> Vec<u8> {
    Sha256::digest(format!("querylayer-delivery-site-v1:{site}").as_bytes()).to_vec()
}

fn public_site(site: &str) -> Option<(Uuid, Uuid)> {
    context::presented_row(
        &public_site_key(site),
        "SELECT site_id, organization_id FROM querylayer.delivery_settings
          WHERE public AND site_sha256 = querylayer.ctx_presented_fingerprint()",
        "public site lookup",
        context::site_and_organization,
    )
}

#[pg_schema]
mod querylayer_api {
    use super::*;

    /// Holds a delivery context for `site`, by the SHA-256 of its delivery token or, with no
    /// fingerprint, because the site is public. A token of another site, a dead token and a
    /// site that is not public (or does not exist) all fail alike: 28000.
    /// SECURITY DEFINER: reads the private credential and delivery tables.
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn authenticate_delivery(site: &str, fingerprint: Option<&[u8]>) -> Jsonb {
        context::refuse_if_established();
        match fingerprint {
            Some(fingerprint) => match context::resolve(Credential::DeliveryToken, fingerprint, true) {
                Resolution::Live(v) if v.get("site").and_then(Value::as_str) == Some(site) => {
                    context::establish(Credential::DeliveryToken, v, None)
                }
                Resolution::Live(_) => {
                    context::authentication_failed(Credential::DeliveryToken, "another_site", None)
                }
                Resolution::Dead { reason, subject, .. } => {
                    context::authentication_failed(Credential::DeliveryToken, &reason, subject)
                }
            },
            None => match public_site(site) {
                Some((site_id, organization_id)) => {
                    context::delivering(site_id, organization_id);
                    Jsonb(json!({"site": site, "access": "public"}))
                }
                None => context::authentication_failed(Credential::DeliveryToken, "not_public", None),
            },
        }
    }

    /// Appends the audit record of a delivery token that failed `authenticate_delivery`.
    /// SECURITY DEFINER: writes the private audit table.
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn record_failed_delivery_authentication(fingerprint: &[u8], channel: &str) -> bool {
        context::record_failure(Credential::DeliveryToken, fingerprint, channel)
    }
}
