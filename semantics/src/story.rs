//! The resilience-desk story (`run_qglake_story`): a supervisor consults a roster of registered
//! specialist agents, each over one governed compartment; every specialist is gated by the real
//! rights engine for its own principal, and each run is signed and recorded.
//!
//! For each specialist, in roster order:
//! * one decision — `read` on its resource for its principal, with the roster's purpose — and its
//!   receipt. Allowed: status `allowed`, the specialist's summary. Denied: status `denied`, a
//!   metadata-only summary naming the resource, and the raw rows redacted. Nothing about who is
//!   denied is written here: it follows from the rights document alone (in the demo, an ODRL
//!   prohibition on the restricted source).
//! * one v1 envelope signed by the server key: sender the server's did:key, recipient the
//!   supervisor's principal, action `respond`, resource `compartment:<agent>`, payload
//!   `{agent, principal, status, summary, evidence, redactions, receipt}`;
//! * one COMPLETE OpenLineage event: job `querylayer-qglake-story.<agent>`, input the resource when
//!   it was read (a denied resource is recorded in the governance facet instead), output
//!   `<roster output>:<agent>`;
//! * one attestation over that event, subject the event's output.
//!
//! Then the synthesis: the aggregate `{supervisor, question, allowedSummaries, denials,
//! evidenceHashes}` (evidence hashes are the response payload hashes) in an envelope to the
//! synthesis agent, action `aggregate`, resource the roster output.

use crate::attestation::{attest, Attestation};
use crate::lineage::{complete_run_event, EnvelopeRef, RunEvent, RunSpec, STORY_JOB};
use crate::rights::{decide, AccessRequest, Action, Receipt, RightsDocument};
use chrono::{DateTime, Utc};
use querylayer_envelope::{Envelope, Signer};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// An agent of the roster that is not a specialist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoryAgent {
    pub name: String,
    pub principal: String,
}

/// A registered specialist and the compartment it consults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Specialist {
    pub name: String,
    /// Its RBAC/ODRL subject.
    pub principal: String,
    /// The governed source of its compartment.
    pub resource: String,
    /// What it reports when allowed.
    pub summary: String,
}

/// The story's cast and question (`demo/story.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoryRoster {
    pub question: String,
    /// The purpose every specialist states.
    #[serde(default)]
    pub purpose: Option<String>,
    #[serde(default)]
    pub semantic_context: Map<String, Value>,
    /// The briefing's dataset name; each specialist's output is `<output>:<agent>`.
    pub output: String,
    pub supervisor: StoryAgent,
    pub synthesis: StoryAgent,
    pub specialists: Vec<Specialist>,
}

/// The governed prompt the supervisor hands out, after gating.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoryPrompt {
    pub question: String,
    pub purpose: Option<String>,
    pub semantic_context: Map<String, Value>,
    pub allowed_sources: Vec<String>,
    pub denied_sources: Vec<String>,
}

/// An agent as listed in the output (no key material).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentView {
    pub name: String,
    pub principal: String,
    /// `supervisor`, `specialist` or `synthesis`.
    pub role: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
}

/// One specialist's governed, signed and recorded run.
#[derive(Debug, Clone, Serialize)]
pub struct SpecialistRun {
    pub agent: String,
    pub principal: String,
    pub resource: String,
    /// `allowed` or `denied`.
    pub status: String,
    pub summary: String,
    pub evidence: Vec<String>,
    pub redactions: Vec<String>,
    pub receipt: Receipt,
    pub envelope: Value,
    pub openlineage: RunEvent,
    pub attestation: Attestation,
}

/// The synthesis step.
#[derive(Debug, Clone, Serialize)]
pub struct Synthesis {
    pub aggregate: Value,
    pub envelope: Value,
}

/// The whole story run.
#[derive(Debug, Clone, Serialize)]
pub struct StoryRun {
    pub prompt: StoryPrompt,
    /// The did:key that signed every envelope and attestation.
    pub signer: String,
    pub agents: Vec<AgentView>,
    pub responses: Vec<SpecialistRun>,
    pub synthesis: Synthesis,
}

fn envelope_json(e: &Envelope) -> Value {
    serde_json::from_str(&e.to_header_json()).expect("an envelope header is JSON")
}

/// Runs the story for `roster` under `rights`, signing with `server` at `now`.
pub fn run_qglake_story(
    roster: &StoryRoster,
    rights: &RightsDocument,
    server: &Signer,
    now: DateTime<Utc>,
) -> StoryRun {
    let created_at = crate::format_timestamp(now);
    let decisions: Vec<_> = roster
        .specialists
        .iter()
        .map(|s| {
            let req = AccessRequest {
                principal: &s.principal,
                resource: &s.resource,
                action: Action::Read,
                purpose: roster.purpose.as_deref(),
            };
            decide(rights, &req, now)
        })
        .collect();
    let prompt = StoryPrompt {
        question: roster.question.clone(),
        purpose: roster.purpose.clone(),
        semantic_context: roster.semantic_context.clone(),
        allowed_sources: roster
            .specialists
            .iter()
            .zip(&decisions)
            .filter(|(_, d)| d.allowed)
            .map(|(s, _)| s.resource.clone())
            .collect(),
        denied_sources: roster
            .specialists
            .iter()
            .zip(&decisions)
            .filter(|(_, d)| !d.allowed)
            .map(|(s, _)| s.resource.clone())
            .collect(),
    };

    let mut responses = Vec::new();
    let mut evidence_hashes = Vec::new();
    for (s, d) in roster.specialists.iter().zip(decisions) {
        let (status, summary, redactions) = if d.allowed {
            ("allowed", s.summary.clone(), Vec::new())
        } else {
            (
                "denied",
                format!("Access to {} denied by policy; metadata-only receipt returned.", s.resource),
                vec![format!("raw rows of {}", s.resource)],
            )
        };
        let evidence = vec![format!("semantic projection for {}", s.name)];
        let payload = json!({
            "agent": s.name, "principal": s.principal, "status": status, "summary": summary,
            "evidence": evidence, "redactions": redactions, "receipt": d.receipt,
        });
        let envelope = Envelope::mint_v1(
            server,
            &roster.supervisor.principal,
            "respond",
            &format!("compartment:{}", s.name),
            &payload,
            &created_at,
        );
        evidence_hashes.push(envelope.payload_sha256.clone());
        let output = format!("{}:{}", roster.output, s.name);
        let read: Vec<String> = if d.allowed { vec![s.resource.clone()] } else { Vec::new() };
        let denied: Vec<String> = if d.allowed { Vec::new() } else { vec![s.resource.clone()] };
        let event = complete_run_event(&RunSpec {
            job_name: &format!("{STORY_JOB}.{}", s.name),
            event_time: now,
            inputs: &read,
            output_name: &output,
            envelope: &EnvelopeRef::from(&envelope),
            principal: &s.principal,
            denied_sources: &denied,
        });
        let attestation = attest(server, &output, &event.to_json(), now);
        responses.push(SpecialistRun {
            agent: s.name.clone(),
            principal: s.principal.clone(),
            resource: s.resource.clone(),
            status: status.to_string(),
            summary,
            evidence,
            redactions,
            receipt: d.receipt,
            envelope: envelope_json(&envelope),
            openlineage: event,
            attestation,
        });
    }

    let aggregate = json!({
        "supervisor": roster.supervisor.name,
        "question": roster.question,
        "allowedSummaries": responses.iter().filter(|r| r.status == "allowed").map(|r| r.summary.clone()).collect::<Vec<_>>(),
        "denials": responses.iter().filter(|r| r.status == "denied").map(|r| r.summary.clone()).collect::<Vec<_>>(),
        "evidenceHashes": evidence_hashes,
    });
    let synthesis_envelope = Envelope::mint_v1(
        server,
        &roster.synthesis.principal,
        "aggregate",
        &roster.output,
        &aggregate,
        &created_at,
    );

    let mut agents = vec![AgentView {
        name: roster.supervisor.name.clone(),
        principal: roster.supervisor.principal.clone(),
        role: "supervisor".into(),
        resource: None,
    }];
    agents.extend(roster.specialists.iter().map(|s| AgentView {
        name: s.name.clone(),
        principal: s.principal.clone(),
        role: "specialist".into(),
        resource: Some(s.resource.clone()),
    }));
    agents.push(AgentView {
        name: roster.synthesis.name.clone(),
        principal: roster.synthesis.principal.clone(),
        role: "synthesis".into(),
        resource: None,
    });

    StoryRun {
        prompt,
        signer: server.did_key(),
        agents,
        responses,
        synthesis: Synthesis { aggregate, envelope: envelope_json(&synthesis_envelope) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attestation::{verify_attestation, verify_attestation_with_key};
    use crate::demo;
    use crate::lineage::tests::assert_valid_run_event;
    use chrono::TimeZone;

    fn run() -> (StoryRun, Signer) {
        let server = Signer::from_seed_bytes(b"querylayer-test-server-key");
        let now = Utc.with_ymd_and_hms(2026, 11, 30, 3, 2, 22).unwrap();
        (run_qglake_story(&demo::story_roster(), &demo::story_rights(), &server, now), server)
    }

    #[test]
    fn only_the_restricted_broker_is_denied_and_by_the_rights() {
        let (story, _) = run();
        let statuses: Vec<(&str, &str)> =
            story.responses.iter().map(|r| (r.agent.as_str(), r.status.as_str())).collect();
        assert_eq!(
            statuses,
            [
                ("FinanceAgent", "allowed"),
                ("EnergyAgent", "allowed"),
                ("MobilityAgent", "allowed"),
                ("ClimateHealthAgent", "allowed"),
                ("ReferenceAgent", "allowed"),
                ("RestrictedDataBroker", "denied"),
            ]
        );
        let broker = &story.responses[5];
        // RBAC grants the broker its resource; the ODRL prohibition of `use` covers `read`.
        assert!(!broker.receipt.allowed);
        assert!(broker.receipt.reason.starts_with("RBAC or ODRL denied action: ODRL: policy urn:querylayer:policy:resilience-desk-story prohibits odrl:read"), "{}", broker.receipt.reason);
        assert_eq!(broker.redactions, ["raw rows of sail.qg_lakehouse.haalsi_baseline__restricted_raw"]);
        assert_eq!(story.prompt.denied_sources, ["sail.qg_lakehouse.haalsi_baseline__restricted_raw"]);
        assert_eq!(story.prompt.allowed_sources.len(), 5);
        assert_eq!(story.synthesis.aggregate["allowedSummaries"].as_array().unwrap().len(), 5);
        assert_eq!(story.synthesis.aggregate["evidenceHashes"].as_array().unwrap().len(), 6);
        assert_eq!(story.agents.len(), 8);
    }

    #[test]
    fn the_denial_follows_the_rights_not_the_roster() {
        // Lift the prohibition: the broker is allowed; drop a specialist's grant: it is denied.
        let mut rights: Value = serde_json::from_str(demo::STORY_RIGHTS_JSON).unwrap();
        rights["odrl"].as_object_mut().unwrap().remove("prohibition");
        rights["rbac"]["grants"][0]["role"] = json!("nobody");
        let server = Signer::from_seed_bytes(b"k");
        let story = run_qglake_story(
            &demo::story_roster(),
            &RightsDocument::from_value(&rights),
            &server,
            Utc.timestamp_opt(0, 0).unwrap(),
        );
        let denied: Vec<&str> =
            story.responses.iter().filter(|r| r.status == "denied").map(|r| r.agent.as_str()).collect();
        assert_eq!(denied, ["FinanceAgent"]);
        // Without the stated purpose the ODRL permission does not apply: everyone is denied.
        let mut roster = demo::story_roster();
        roster.purpose = None;
        let story =
            run_qglake_story(&roster, &demo::story_rights(), &server, Utc.timestamp_opt(0, 0).unwrap());
        assert!(story.responses.iter().all(|r| r.status == "denied"));
    }

    #[test]
    fn one_complete_valid_event_and_one_verifying_attestation_per_specialist() {
        let (story, server) = run();
        let mut run_ids = Vec::new();
        for r in &story.responses {
            let event = serde_json::to_value(&r.openlineage).unwrap();
            assert_eq!(event["eventType"], "COMPLETE");
            assert_valid_run_event(&event);
            assert_eq!(r.openlineage.job.name, format!("querylayer-qglake-story.{}", r.agent));
            assert!(verify_attestation(&r.attestation, &r.openlineage.to_json()));
            assert!(verify_attestation_with_key(&r.attestation, &r.openlineage.to_json(), &story.signer));
            assert_eq!(r.attestation.issuer, server.did_key());
            let env = Envelope::parse(&r.envelope.to_string()).unwrap();
            assert!(env.signature_valid());
            assert_eq!(r.openlineage.run.run_id, crate::lineage::run_id_for(&env.signature));
            run_ids.push(r.openlineage.run.run_id.clone());
            let inputs: Vec<&str> = r.openlineage.inputs.iter().map(|d| d.name.as_str()).collect();
            if r.status == "denied" {
                assert!(inputs.is_empty());
                assert_eq!(
                    r.openlineage.run.facets.governance.denied_sources,
                    std::slice::from_ref(&r.resource)
                );
            } else {
                assert_eq!(inputs, [r.resource.as_str()]);
            }
        }
        run_ids.dedup();
        assert_eq!(run_ids.len(), 6);
        let synth = Envelope::parse(&story.synthesis.envelope.to_string()).unwrap();
        assert!(synth.signature_valid());
        // Same key, same time: the run is reproducible.
        let (again, _) = run();
        assert_eq!(serde_json::to_string(&again).unwrap(), serde_json::to_string(&story).unwrap());
    }
}
