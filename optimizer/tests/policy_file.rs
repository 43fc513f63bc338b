//! The policy file shown in the operators' guide (docs/operators.md) parses, and every value it
//! shows is the default.

use optimizer::config::PolicyConfig;
use optimizer::heuristics::Heuristics;

#[test]
fn the_documented_policy_file_is_valid_and_shows_the_defaults() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operators.md"))
            .unwrap();
    let section = &readme[readme.find("## Policies (optimizer)").expect("section")..];
    let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let text = &section[start..start + section[start..].find("```").unwrap()];
    let config = PolicyConfig::from_toml(text).unwrap();
    assert_eq!(config.heuristics, Heuristics::default().heuristics);
}
