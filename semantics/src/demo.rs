//! The embedded resilience-desk demo: the OSI model and rights that `querylayer admin seed-demo`
//! loads, the question and principal of the captured reference run, and the story roster with its
//! own rights. The files live in `semantics/demo/`; their text is exposed as is so the loader can
//! store exactly what is shipped.

use crate::osi::{parse_document, OsiDocument};
use crate::rights::RightsDocument;
use crate::story::StoryRoster;

/// `demo/resilience_desk.yaml`: the demo OSI model.
pub const MODEL_YAML: &str = include_str!("../demo/resilience_desk.yaml");
/// `demo/rights.json`: the demo RBAC + ODRL document, in the reference's shape.
pub const RIGHTS_JSON: &str = include_str!("../demo/rights.json");
/// `demo/story.json`: the story's registered agents and their compartments.
pub const STORY_JSON: &str = include_str!("../demo/story.json");
/// `demo/story_rights.json`: the rights the story's agents are gated by.
pub const STORY_RIGHTS_JSON: &str = include_str!("../demo/story_rights.json");

/// The principal the demo question is asked for.
pub const PRINCIPAL: &str = "did:example:qg-navigator";
/// The demo question.
pub const QUESTION: &str = "Where do fiscal capacity and energy burden overlap with health risk?";

/// The demo model, parsed.
pub fn model() -> OsiDocument {
    parse_document(MODEL_YAML).expect("the embedded demo model is valid")
}

/// The demo rights, parsed.
pub fn rights() -> RightsDocument {
    RightsDocument::parse(RIGHTS_JSON)
}

/// The story roster, parsed.
pub fn story_roster() -> StoryRoster {
    serde_json::from_str(STORY_JSON).expect("the embedded story roster is valid")
}

/// The story rights, parsed.
pub fn story_rights() -> RightsDocument {
    RightsDocument::parse(STORY_RIGHTS_JSON)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_files_parse_without_problems() {
        assert_eq!(model().semantic_model.name, "resilience_desk");
        assert!(rights().problems().is_empty());
        assert!(story_rights().problems().is_empty(), "{:?}", story_rights().problems());
        assert_eq!(story_roster().specialists.len(), 6);
    }
}
