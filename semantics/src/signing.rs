//! Signs and binds a governed answer: a TypeDID envelope (v1, signed by the server's key) carrying
//! the answer, its plans and receipts; a COMPLETE OpenLineage run event named after the envelope
//! signature; and an attestation over that event's hash.
//!
//! The envelope is `querylayer_envelope::Envelope::mint_v1(server, recipient, "answer",
//! "model:<model name>", payload, created_at)` with the reference's payload
//! `{question, answer, synthesizedBy, plans, receipts, deniedSources}`, so QueryGraph's
//! `TypeDidEnvelope.verify_signature` accepts it. The event's output (and the attestation's
//! subject) is `querylayer:answer:<first 16 hex of payload_sha256>`.

use crate::attestation::{attest, Attestation};
use crate::lineage::{complete_run_event, EnvelopeRef, RunEvent, RunSpec, ANSWER_JOB};
use crate::navigator::NavigatorAnswer;
use chrono::{DateTime, Utc};
use querylayer_envelope::{Envelope, Signer};
use serde::Serialize;
use serde_json::{json, Value};

/// The envelope action of an answer.
pub const ANSWER_ACTION: &str = "answer";

/// An answer with its evidence chain. Serializes as the answer's fields followed by `envelope`,
/// `openlineage` and `attestation`.
#[derive(Debug, Clone, Serialize)]
pub struct SignedAnswer {
    #[serde(flatten)]
    pub answer: NavigatorAnswer,
    /// The envelope as JSON (parsed from its header text).
    pub envelope: Value,
    pub openlineage: RunEvent,
    pub attestation: Attestation,
}

impl SignedAnswer {
    /// The exact event text the attestation covers (store this text).
    pub fn openlineage_json(&self) -> String {
        self.openlineage.to_json()
    }
}

/// The envelope payload of an answer, in the reference's shape.
pub fn answer_payload(answer: &NavigatorAnswer) -> Value {
    json!({
        "question": answer.question,
        "answer": answer.answer,
        "synthesizedBy": answer.synthesized_by,
        "plans": answer.plans,
        "receipts": answer.receipts,
        "deniedSources": answer.denied_sources,
    })
}

/// Who and what an answer is signed for.
#[derive(Debug, Clone, Copy)]
pub struct AnswerContext<'a> {
    /// The semantic model's name (the envelope resource is `model:<name>`).
    pub model_name: &'a str,
    /// The principal the answer was governed for (recorded in the lineage governance facet).
    pub principal: &'a str,
    /// The envelope recipient: the DID the answer is returned to.
    pub recipient: &'a str,
}

/// Signs `answer` with the server key at `now`.
pub fn sign_answer(
    answer: NavigatorAnswer,
    ctx: &AnswerContext,
    server: &Signer,
    now: DateTime<Utc>,
) -> SignedAnswer {
    let created_at = crate::format_timestamp(now);
    let resource = format!("model:{}", ctx.model_name);
    let envelope = Envelope::mint_v1(
        server,
        ctx.recipient,
        ANSWER_ACTION,
        &resource,
        &answer_payload(&answer),
        &created_at,
    );
    let envelope_ref = EnvelopeRef::from(&envelope);
    let output = format!("querylayer:answer:{}", &envelope.payload_sha256[..16]);
    let event = complete_run_event(&RunSpec {
        job_name: ANSWER_JOB,
        event_time: now,
        inputs: &answer.planned_sources(),
        output_name: &output,
        envelope: &envelope_ref,
        principal: ctx.principal,
        denied_sources: &answer.denied_sources,
    });
    let attestation = attest(server, &output, &event.to_json(), now);
    let envelope = serde_json::from_str(&envelope.to_header_json()).expect("an envelope header is JSON");
    SignedAnswer { answer, envelope, openlineage: event, attestation }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attestation::verify_attestation;
    use crate::demo;
    use crate::lineage::run_id_for;
    use crate::navigator::{answer_question, NavigatorRequest, DEFAULT_DIALECT};
    use chrono::TimeZone;

    fn signed() -> (SignedAnswer, Signer) {
        let server = Signer::from_seed_bytes(b"querylayer-test-server-key");
        let now = Utc.with_ymd_and_hms(2026, 11, 30, 3, 1, 41).unwrap();
        let req = NavigatorRequest {
            question: demo::QUESTION,
            principal: demo::PRINCIPAL,
            purpose: None,
            dialect: DEFAULT_DIALECT,
        };
        let answer = answer_question(&demo::model(), &demo::rights(), &req, now);
        let ctx = AnswerContext {
            model_name: "resilience_desk",
            principal: demo::PRINCIPAL,
            recipient: demo::PRINCIPAL,
        };
        (sign_answer(answer, &ctx, &server, now), server)
    }

    #[test]
    fn the_chain_verifies_end_to_end() {
        let (s, server) = signed();
        // The envelope verifies with the envelope crate (as QueryGraph's clients would).
        let env = Envelope::parse(&serde_json::to_string(&s.envelope).unwrap()).unwrap();
        assert!(env.signature_valid());
        assert_eq!(env.sender, server.did_key());
        assert_eq!((env.action.as_str(), env.resource.as_str()), ("answer", "model:resilience_desk"));
        // The run is named by the envelope signature; the output by its payload hash.
        assert_eq!(s.openlineage.run.run_id, run_id_for(&env.signature));
        assert_eq!(s.openlineage.outputs[0].name, format!("querylayer:answer:{}", &env.payload_sha256[..16]));
        assert_eq!(
            s.openlineage.inputs.len(),
            2,
            "countydata once, access once; the denied source is not an input"
        );
        assert_eq!(
            s.openlineage.run.facets.governance.denied_sources,
            ["sail.qg_lakehouse.haalsi_baseline__restricted_raw"]
        );
        crate::lineage::tests::assert_valid_run_event(&serde_json::to_value(&s.openlineage).unwrap());
        assert!(verify_attestation(&s.attestation, &s.openlineage_json()));
        assert_eq!(s.attestation.subject, s.openlineage.outputs[0].name);
        let mut tampered = s.openlineage.clone();
        tampered.inputs.pop();
        assert!(!verify_attestation(&s.attestation, &tampered.to_json()));
    }

    #[test]
    fn the_signed_answer_keeps_the_answer_fields_first() {
        let (s, _) = signed();
        let text = serde_json::to_string(&s).unwrap();
        assert!(text.starts_with("{\"question\":\"Where do fiscal capacity"));
        let v: Value = serde_json::from_str(&text).unwrap();
        for key in [
            "question",
            "answer",
            "synthesized_by",
            "matches",
            "plans",
            "receipts",
            "denied_sources",
            "prompt",
            "envelope",
            "openlineage",
            "attestation",
        ] {
            assert!(v.get(key).is_some(), "{key}");
        }
        assert_eq!(
            v["envelope"]["payload"]["deniedSources"][0],
            "sail.qg_lakehouse.haalsi_baseline__restricted_raw"
        );
    }
}
