//! Fuzzing the job spec on stable Rust (proptest): the example specs, mangled by random edits,
//! and random text are read and validated. Never a panic; a refusal says what is wrong. CI runs
//! 256 cases per seed; the long run is
//! `PROPTEST_CASES=100000 cargo test -p vocab --test fuzz_spec --release`.

use proptest::prelude::*;
use test_support::fuzz::{cases, input};
use vocab::JobSpec;

fn example(rel: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn read(text: &str) {
    match JobSpec::from_yaml(text)
        .map_err(|e| e.to_string())
        .and_then(|s| {
            s.validate().map_err(|e| e.to_string())?;
            vocab::spec::host::check(&s).map_err(|e| e.to_string())
        }) {
        Ok(()) => {}
        Err(e) => assert!(!e.trim().is_empty(), "an empty error for {text:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(256)))]

    #[test]
    fn ps_specs(text in input(example("ps-ctr.yaml"))) {
        read(&text);
    }

    #[test]
    fn allreduce_specs(text in input(example("allreduce-ctr.yaml"))) {
        read(&text);
    }

    #[test]
    fn resource_free_specs(text in input(example("brain/ps-free.yaml"))) {
        read(&text);
    }
}

#[test]
fn the_seeds_are_valid_specs() {
    for rel in ["ps-ctr.yaml", "allreduce-ctr.yaml", "brain/ps-free.yaml"] {
        let s = JobSpec::from_yaml(&example(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        s.validate().unwrap_or_else(|e| panic!("{rel}: {e}"));
    }
}
