//! Fuzzing the operator's policy file on stable Rust (proptest): every example policy, mangled
//! by random edits, and random text are parsed and validated. Never a panic; a refusal says
//! what is wrong. CI runs 64 cases per seed; the long run is
//! `PROPTEST_CASES=100000 cargo test -p optimizer --test fuzz_policy --release`.

use optimizer::config::PolicyConfig;
use proptest::prelude::*;
use test_support::fuzz::{cases, input};

fn seeds() -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut out: Vec<String> = std::fs::read_dir(root.join("policies"))
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    out.push(std::fs::read_to_string(root.join("brain/policy.toml")).unwrap());
    out.sort();
    out
}

#[test]
fn every_example_policy_loads() {
    let seeds = seeds();
    assert!(seeds.len() >= 10, "{} example policies", seeds.len());
    for text in seeds {
        if let Err(e) = PolicyConfig::from_toml(&text) {
            panic!("{e}\n{text}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(256)))]

    #[test]
    fn policies(text in prop::sample::select(seeds()).prop_flat_map(input)) {
        if let Err(e) = PolicyConfig::from_toml(&text) {
            prop_assert!(!e.to_string().trim().is_empty());
        }
    }
}

#[test]
fn the_seeds_are_valid_policies() {
    for s in seeds() {
        PolicyConfig::from_toml(&s).unwrap_or_else(|e| panic!("{e}\n{s}"));
    }
}
