//! Search of a semantic model: turning a question into terms, and finding the datasets, fields and
//! metrics those terms name, in a documented deterministic order.
//!
//! # Terms
//!
//! The question is lowercased and split into words (runs of letters, digits and `_`). Stopwords
//! (`a an and are by do does for how in is of on or the to what where which who why`) and words
//! of two characters or fewer are dropped. The terms are the remaining words in question order,
//! then every run of 2 adjacent remaining words, then of 3, … up to the longest name or synonym
//! in the model (at most [`MAX_NGRAM`] words): that is how multi-word synonyms such as
//! `budget headroom` are found.
//!
//! # What a term matches, from strongest to weakest
//!
//! 1. [`Via::Name`] — the term equals the item's name (case-insensitively);
//! 2. [`Via::Synonym`] — the term equals one of the item's `ai_context.synonyms`,
//!    case-insensitively, or after the synonym is split into words as the question is (and, when
//!    two or more words remain, without the words questions drop: `cost of living` is found by
//!    the question `cost of living?`, whose terms skip `of`);
//! 3. [`Via::NameContains`] — the term is a substring of the name;
//! 4. [`Via::Description`] — the term is a substring of the description;
//! 5. [`Via::AiContext`] — the term is a substring of the `ai_context` instructions or examples.
//!
//! Items are the model's datasets, each dataset's fields, and the model's metrics. Model-level
//! `ai_context` describes the whole model and matches nothing.
//!
//! # Ranking
//!
//! Each item is found by the first term (in term order) that matches it, and ranked by:
//! (1) the position of that term — so results follow the question's own word order, which keeps
//! the navigator's matches in the order the question raises them; (2) the strength of that match,
//! as listed above; (3) model order: each dataset followed by its fields, in declaration order,
//! then the metrics. Every key is total and nothing depends on hashing, so the same model and
//! question always give the same list.

use crate::osi::{AiContext, OsiDocument};
use serde::{Deserialize, Serialize};

/// Words ignored when building terms.
pub const STOPWORDS: [&str; 21] = [
    "a", "an", "and", "are", "by", "do", "does", "for", "how", "in", "is", "of", "on", "or", "the", "to",
    "what", "where", "which", "who", "why",
];

/// The longest run of words tried as one term.
pub const MAX_NGRAM: usize = 4;

/// What kind of item matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatchKind {
    Dataset,
    Field,
    Metric,
}

impl MatchKind {
    /// `dataset`, `field` or `metric`.
    pub fn as_str(self) -> &'static str {
        match self {
            MatchKind::Dataset => "dataset",
            MatchKind::Field => "field",
            MatchKind::Metric => "metric",
        }
    }
}

/// A matched item, as the navigator reports it: `{kind, name[, dataset]}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Match {
    pub kind: MatchKind,
    pub name: String,
    /// The dataset of a field; absent for datasets and metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
}

/// How a term matched an item, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    Name,
    Synonym,
    NameContains,
    Description,
    AiContext,
}

/// A ranked search result with the evidence for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SearchHit {
    pub kind: MatchKind,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    /// 1 for the first result.
    pub rank: usize,
    /// The term that found the item.
    pub term: String,
    /// How that term matched it.
    pub via: Via,
}

impl SearchHit {
    /// The `{kind, name[, dataset]}` part.
    pub fn to_match(&self) -> Match {
        Match { kind: self.kind, name: self.name.clone(), dataset: self.dataset.clone() }
    }
}

/// The lowercased words of a text (letters, digits, `_`), unfiltered.
pub fn words(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// True for a word questions keep: longer than two characters and not a stopword.
fn kept_word(w: &str) -> bool {
    w.chars().count() > 2 && !STOPWORDS.contains(&w)
}

/// The terms of a question (see the module documentation), n-grams up to `max_ngram` words.
pub fn question_terms(question: &str, max_ngram: usize) -> Vec<String> {
    let kept: Vec<String> = words(question)
        .into_iter()
        .filter(|w| w.chars().count() > 2 && !STOPWORDS.contains(&w.as_str()))
        .collect();
    let mut terms = kept.clone();
    for n in 2..=max_ngram.min(MAX_NGRAM) {
        for window in kept.windows(n) {
            terms.push(window.join(" "));
        }
    }
    terms
}

/// One searchable item, flattened in model order, with its texts lowercased once.
struct Item<'a> {
    kind: MatchKind,
    name: &'a str,
    dataset: Option<&'a str>,
    name_lc: String,
    /// Every form a synonym is recognized in (see [`synonym_forms`]).
    synonyms: Vec<String>,
    /// Words of the longest synonym or of the name: no longer term can match them exactly.
    phrase_words: usize,
    description_lc: Option<String>,
    /// `ai_context` instructions and examples.
    ai_texts_lc: Vec<String>,
}

impl<'a> Item<'a> {
    fn new(
        kind: MatchKind,
        name: &'a str,
        dataset: Option<&'a str>,
        description: Option<&str>,
        ai_context: Option<&AiContext>,
    ) -> Item<'a> {
        let raw_synonyms: &[String] = ai_context.map(|c| c.synonyms.as_slice()).unwrap_or_default();
        let phrase_words =
            raw_synonyms.iter().map(|s| words(s).len()).chain([words(name).len()]).max().unwrap_or(1);
        Item {
            kind,
            name,
            dataset,
            name_lc: name.to_lowercase(),
            synonyms: raw_synonyms.iter().flat_map(|s| synonym_forms(s)).collect(),
            phrase_words,
            description_lc: description.map(str::to_lowercase),
            ai_texts_lc: ai_context
                .map(|c| c.instructions.iter().chain(c.examples.iter()).map(|t| t.to_lowercase()).collect())
                .unwrap_or_default(),
        }
    }
}

/// The forms a synonym matches a term in: as written (lowercased, trimmed); as its words joined by
/// single spaces (`Health-Risk` → `health risk`); and, when at least two words remain, without
/// the words questions drop (`cost of living` → `cost living`, the bigram the question
/// `cost of living` yields).
fn synonym_forms(synonym: &str) -> Vec<String> {
    let all = words(synonym);
    let kept: Vec<&str> = all.iter().map(String::as_str).filter(|w| kept_word(w)).collect();
    let mut forms = vec![synonym.trim().to_lowercase(), all.join(" ")];
    if kept.len() >= 2 {
        forms.push(kept.join(" "));
    }
    forms.dedup();
    forms
}

fn items(model: &OsiDocument) -> Vec<Item<'_>> {
    let m = &model.semantic_model;
    let mut out = Vec::new();
    for d in &m.datasets {
        out.push(Item::new(
            MatchKind::Dataset,
            &d.name,
            None,
            d.description.as_deref(),
            d.ai_context.as_ref(),
        ));
        for f in &d.fields {
            out.push(Item::new(
                MatchKind::Field,
                &f.name,
                Some(&d.name),
                f.description.as_deref(),
                f.ai_context.as_ref(),
            ));
        }
    }
    for x in &m.metrics {
        out.push(Item::new(
            MatchKind::Metric,
            &x.name,
            None,
            x.description.as_deref(),
            x.ai_context.as_ref(),
        ));
    }
    out
}

/// The strongest way `term` matches `item`, if any.
fn strength(item: &Item, term: &str) -> Option<Via> {
    if item.name_lc == term {
        Some(Via::Name)
    } else if item.synonyms.iter().any(|s| s == term) {
        Some(Via::Synonym)
    } else if item.name_lc.contains(term) {
        Some(Via::NameContains)
    } else if item.description_lc.as_deref().is_some_and(|d| d.contains(term)) {
        Some(Via::Description)
    } else if item.ai_texts_lc.iter().any(|t| t.contains(term)) {
        Some(Via::AiContext)
    } else {
        None
    }
}

/// The longest name or synonym of the model, in words (at least 2, so bigrams are always tried).
fn longest_phrase(items: &[Item]) -> usize {
    items.iter().map(|i| i.phrase_words).max().unwrap_or(1).max(2)
}

/// Searches `model` for the items a question (or a single term) names, ranked as documented.
pub fn search(model: &OsiDocument, question: &str) -> Vec<SearchHit> {
    let items = items(model);
    let terms = question_terms(question, longest_phrase(&items));
    // (term position, strength, model position) per found item.
    let mut found: Vec<(usize, Via, usize)> = Vec::new();
    for (pos, item) in items.iter().enumerate() {
        for (t, term) in terms.iter().enumerate() {
            if let Some(via) = strength(item, term) {
                found.push((t, via, pos));
                break;
            }
        }
    }
    found.sort();
    found
        .into_iter()
        .enumerate()
        .map(|(rank, (t, via, pos))| {
            let item = &items[pos];
            SearchHit {
                kind: item.kind,
                name: item.name.to_string(),
                dataset: item.dataset.map(str::to_string),
                rank: rank + 1,
                term: terms[t].clone(),
                via,
            }
        })
        .collect()
}

/// The matches of [`search`], without the evidence.
pub fn search_matches(model: &OsiDocument, question: &str) -> Vec<Match> {
    search(model, question).iter().map(SearchHit::to_match).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::osi::parse_value;
    use serde_json::json;

    fn demo() -> OsiDocument {
        crate::demo::model()
    }

    fn names(hits: &[SearchHit]) -> Vec<(&'static str, String)> {
        hits.iter().map(|h| (h.kind.as_str(), h.name.clone())).collect()
    }

    #[test]
    fn terms_drop_stopwords_and_short_words_then_add_ngrams() {
        assert_eq!(
            question_terms("What is our budget headroom?", 2),
            ["our", "budget", "headroom", "our budget", "budget headroom"]
        );
        // Stopwords are skipped before n-grams are built, as in the reference.
        assert!(question_terms("budget for headroom", 2).contains(&"budget headroom".to_string()));
        assert_eq!(question_terms("a by to", 3), Vec::<String>::new());
    }

    #[test]
    fn the_demo_question_finds_what_the_reference_finds_in_the_same_order() {
        let hits = search(&demo(), "Where do fiscal capacity and energy burden overlap with health risk?");
        assert_eq!(
            names(&hits),
            [
                ("dataset", "county_finance".into()),
                ("metric", "fiscal_capacity".into()),
                ("dataset", "energy_burden".into()),
                ("field", "monthly_cost".into()),
                ("dataset", "restricted_health".into()),
            ]
        );
        let vias: Vec<(&str, Via)> = hits.iter().map(|h| (h.term.as_str(), h.via)).collect();
        assert_eq!(
            vias,
            [
                ("fiscal", Via::Synonym),
                ("fiscal", Via::NameContains),
                ("energy", Via::Synonym),
                ("energy", Via::Description),
                ("health", Via::Synonym)
            ]
        );
        assert_eq!(hits.iter().map(|h| h.rank).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    }

    #[test]
    fn multi_word_synonyms_match_through_ngrams() {
        let hits = search(&demo(), "What is our budget headroom?");
        assert_eq!(names(&hits), [("metric", "fiscal_capacity".to_string())]);
        assert_eq!((hits[0].term.as_str(), hits[0].via), ("budget headroom", Via::Synonym));
        // A three-word synonym needs a trigram; the model's longest phrase enables it.
        let m = parse_value(&json!({"semantic_model": {"name": "m", "metrics": [
            {"name": "spe", "expression": {"dialects": [{"dialect": "ANSI_SQL", "expression": "1"}]},
             "ai_context": {"synonyms": ["Sales per Employee"]}}]}}))
        .unwrap();
        let hits = search(&m, "show sales per employee");
        assert_eq!((hits[0].term.as_str(), hits[0].via), ("sales per employee", Via::Synonym));
    }

    #[test]
    fn synonyms_with_stopwords_or_punctuation_still_match() {
        let m = parse_value(&json!({"semantic_model": {"name": "m", "datasets": [
            {"name": "col", "source": "s.c", "ai_context": {"synonyms": ["Cost of Living", "health-risk", "x-ray"]}}]}}))
        .unwrap();
        assert_eq!(search(&m, "what is the cost of living?")[0].term, "cost living");
        assert_eq!(search(&m, "health risk")[0].via, Via::Synonym);
        // A one-word remainder is not a synonym form: `ray` alone does not mean `x-ray`.
        assert!(search(&m, "ray").is_empty());
    }

    #[test]
    fn strength_orders_items_found_by_the_same_term_and_model_order_breaks_ties() {
        let m = parse_value(&json!({"semantic_model": {"name": "m", "datasets": [
            {"name": "a_notes", "source": "s.a", "description": "revenue notes"},
            {"name": "b", "source": "s.b", "ai_context": {"instructions": "join on revenue keys"}},
            {"name": "c", "source": "s.c", "ai_context": {"synonyms": ["revenue"]}},
            {"name": "revenue", "source": "s.d"},
            {"name": "revenue_daily", "source": "s.e"},
            {"name": "f", "source": "s.f", "description": "Revenue by day"}
        ]}}))
        .unwrap();
        let hits = search(&m, "revenue");
        assert_eq!(
            hits.iter().map(|h| (h.name.as_str(), h.via)).collect::<Vec<_>>(),
            [
                ("revenue", Via::Name),
                ("c", Via::Synonym),
                ("revenue_daily", Via::NameContains),
                ("a_notes", Via::Description),
                ("f", Via::Description),
                ("b", Via::AiContext),
            ]
        );
        // Deterministic: the same input always yields the same ranking.
        for _ in 0..5 {
            assert_eq!(search(&m, "revenue"), hits);
        }
    }

    #[test]
    fn earlier_question_terms_rank_first() {
        let hits = search(&demo(), "health and fiscal");
        assert_eq!(names(&hits)[0], ("dataset", "restricted_health".into()));
        assert_eq!(names(&hits)[1], ("dataset", "county_finance".into()));
    }

    #[test]
    fn unicode_words_are_kept_whole() {
        assert_eq!(words("Énergie, café!"), ["énergie", "café"]);
        assert!(search(&demo(), "Tell me about énergie and café").is_empty());
        assert!(search(&demo(), "").is_empty());
    }
}
