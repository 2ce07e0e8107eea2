//! Hostile input for the OSI importer: any text, any JSON and any mutation of a valid model is
//! either a model or a list of errors, each naming the path it is about; nothing panics.

use proptest::prelude::*;
use querylayer_semantics::osi;
use serde_json::{json, Value};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        ".{0,16}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("semantic_model".to_string()),
                    Just("name".to_string()),
                    Just("datasets".to_string()),
                    Just("source".to_string()),
                    Just("fields".to_string()),
                    Just("metrics".to_string()),
                    Just("expression".to_string()),
                    Just("dialects".to_string()),
                    ".{0,6}"
                ],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn example() -> Value {
    osi::parse_text(include_str!("../testdata/osi-example-tpcds.yaml")).expect("the vendored example parses")
}

/// Replaces the value at a position of `doc` chosen by the walk `choices`.
fn mutate(doc: &mut Value, choices: &[usize], replacement: Value) {
    let Some((&c, rest)) = choices.split_first() else {
        *doc = replacement;
        return;
    };
    match doc {
        Value::Object(m) if !m.is_empty() => {
            let key = m.keys().nth(c % m.len()).unwrap().clone();
            mutate(m.get_mut(&key).unwrap(), rest, replacement)
        }
        Value::Array(a) if !a.is_empty() => {
            let n = a.len();
            mutate(&mut a[c % n], rest, replacement)
        }
        _ => *doc = replacement,
    }
}

fn check(result: Result<osi::OsiDocument, Vec<osi::OsiError>>) -> Result<(), TestCaseError> {
    if let Err(errors) = result {
        prop_assert!(!errors.is_empty());
        for e in errors {
            prop_assert!(!e.message.is_empty());
            prop_assert!(e.to_string().contains(':'), "{}", e);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_text_is_a_model_or_named_errors(text in ".{0,300}") {
        check(osi::parse_document(&text))?;
    }

    #[test]
    fn any_json_is_a_model_or_named_errors(value in json_value()) {
        check(osi::parse_value(&value))?;
    }

    #[test]
    fn a_mutated_model_is_a_model_or_errors_naming_where(choices in prop::collection::vec(any::<usize>(), 0..6),
                                                         replacement in json_value()) {
        let mut doc = example();
        mutate(&mut doc, &choices, replacement);
        match osi::parse_value(&doc) {
            Ok(model) => {
                // What parsed reads back unchanged from its normalized form.
                let again = osi::parse_value(&model.to_normalized_json()).expect("normalized form parses");
                prop_assert_eq!(again.to_normalized_json(), model.to_normalized_json());
            }
            Err(errors) => {
                prop_assert!(!errors.is_empty());
                for e in &errors {
                    prop_assert!(!e.message.is_empty());
                }
            }
        }
    }
}
