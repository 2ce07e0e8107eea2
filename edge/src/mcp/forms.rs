//! Form screening metrics: aggregate counts of the site's form screening decisions by day,
//! form, decision and reason. No payload, contact detail, actor, network marker or raw signal
//! ever reaches an agent.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::output::Json;
use super::QueryLayerMcp;
use crate::db::Call;

/// The window and form to count.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FormMetricsParams {
    /// How many days back, today (UTC) included (1 to 366; default 30).
    pub days: Option<i32>,
    /// Only this form (its key).
    pub form: Option<String>,
}

/// One aggregate count.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ScreeningCount {
    /// The UTC day.
    pub day: String,
    pub form: String,
    /// `accepted`, `rejected` or `review`.
    pub decision: String,
    /// The screening reason code.
    pub reason: String,
    pub count: i64,
}

/// Aggregate form screening counts.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct FormMetrics {
    pub days: i32,
    /// Raw rejected events are deleted after this many days (the bounded retention window).
    pub rejected_raw_retention_days: i32,
    /// Rejected totals follow that window: they are counted only for days from this UTC date
    /// on. Accepted and review totals cover every day asked for.
    pub rejected_since: String,
    pub counts: Vec<ScreeningCount>,
}

#[tool_router(router = forms_router, vis = "pub(super)")]
impl QueryLayerMcp {
    /// Count the site's form screening decisions by day, form, decision (accepted, rejected,
    /// review) and reason. Aggregates only: never a submission, contact detail or signal.
    /// Rejected totals follow the bounded retention window of raw rejected events (from
    /// `rejected_since` on); the purge changes no count. Needs site:read.
    #[tool(name = "querylayer_form_screening_metrics")]
    async fn form_screening_metrics(
        &self,
        Parameters(p): Parameters<FormMetricsParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<FormMetrics>, CallToolResult> {
        let call = Call::new("form_screening_metrics").opt("p_days", p.days).opt("p_form", p.form);
        self.call(&ctx, call).await
    }
}
