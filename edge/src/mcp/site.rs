//! Site tools: what this connection is bound to.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::output::Json;
use super::QueryLayerMcp;
use crate::db::Call;

/// No arguments: the connection already names its site.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SiteContextParams {}

/// A slug and a display name.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Named {
    pub slug: String,
    pub name: String,
}

/// The agent identity behind the connection.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct AgentIdentity {
    /// The agent's handle within its organization.
    pub handle: String,
    /// `generic` or `hermes`.
    pub kind: String,
    /// The immutable Hermes profile id, if any.
    pub profile_id: Option<String>,
    /// The Hermes profile's current name (a routing attribute only).
    pub profile_name: Option<String>,
}

/// The connection itself (never its secret).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ConnectionInfo {
    pub name: String,
    /// The secret's public prefix, for recognising it in lists.
    pub prefix: String,
    pub expires_at: String,
    pub harness: String,
}

/// Who and where this connection acts.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SiteContext {
    pub organization: Named,
    pub site: Named,
    pub agent: AgentIdentity,
    pub connection: ConnectionInfo,
    /// The scopes in force now (a connection's scopes narrowed to the agent's current permissions).
    pub scopes: Vec<String>,
    /// The site's templates, which every draft follows (querylayer_list_templates gives their fields).
    #[serde(default)]
    pub templates: Vec<String>,
}

#[tool_router(router = site_router, vis = "pub(super)")]
impl QueryLayerMcp {
    /// Describe the organization, site, agent and connection this session acts as, and the
    /// scopes in force now. Call it first to learn what you may do.
    #[tool(name = "querylayer_site_context")]
    async fn site_context(
        &self,
        Parameters(_): Parameters<SiteContextParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SiteContext>, CallToolResult> {
        self.call(&ctx, Call::new("site_context")).await
    }
}
