//! Mangled text for fuzzing parsers on stable Rust with proptest: a valid document (a seed)
//! with random edits (characters inserted, deleted and replaced, the text cut short), or random
//! text. Parsers fed it may accept or refuse it, never panic. For RPC handlers, [`message`]:
//! random protobuf bytes, which each request type decodes as it can.

use proptest::prelude::*;

/// One edit of a text: at a position (a fraction of its length), insert, delete or replace.
#[derive(Clone, Debug)]
pub enum Edit {
    Insert(f64, char),
    Delete(f64, usize),
    Replace(f64, char),
    Truncate(f64),
}

fn edit() -> impl Strategy<Value = Edit> {
    let at = 0.0..1.0f64;
    // Characters a trace is made of, and anything else.
    let ch = prop_oneof![
        prop::sample::select(vec![
            ',', '\t', '\n', '"', '-', '.', 'e', '0', '9', ' ', '[', '{'
        ]),
        any::<char>(),
    ];
    prop_oneof![
        (at.clone(), ch.clone()).prop_map(|(a, c)| Edit::Insert(a, c)),
        (at.clone(), 1..40usize).prop_map(|(a, n)| Edit::Delete(a, n)),
        (at.clone(), ch).prop_map(|(a, c)| Edit::Replace(a, c)),
        at.prop_map(Edit::Truncate),
    ]
}

pub fn apply(text: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for e in edits {
        let at = |f: f64, len: usize| ((f * len as f64) as usize).min(len);
        match *e {
            Edit::Insert(f, c) => {
                let i = at(f, chars.len());
                chars.insert(i, c);
            }
            Edit::Delete(f, n) => {
                let i = at(f, chars.len());
                let j = (i + n).min(chars.len());
                chars.drain(i..j);
            }
            Edit::Replace(f, c) => {
                if !chars.is_empty() {
                    let i = at(f, chars.len() - 1);
                    chars[i] = c;
                }
            }
            Edit::Truncate(f) => {
                let i = at(f, chars.len());
                chars.truncate(i);
            }
        }
    }
    chars.into_iter().collect()
}

/// A mangled seed, or random text.
pub fn input(seed: String) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::vec(edit(), 0..12).prop_map(move |e| apply(&seed, &e)),
        1 => ".{0,400}",
    ]
}

/// How many cases a fuzz test runs: `PROPTEST_CASES`, else `default` (what CI runs).
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(default)
}

/// One protobuf field with a random value: a varint, a 64- or 32-bit number, or random bytes
/// (strings, nested messages, packed lists).
fn field() -> impl Strategy<Value = Vec<u8>> {
    let varint = |mut v: u64, out: &mut Vec<u8>| loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            break;
        }
        out.push(b | 0x80);
    };
    (
        1u64..8,
        0u8..4,
        any::<u64>(),
        proptest::collection::vec(any::<u8>(), 0..40),
    )
        .prop_map(move |(number, kind, value, bytes)| {
            let mut out = Vec::new();
            match kind {
                0 => {
                    varint(number << 3, &mut out);
                    varint(value, &mut out);
                }
                1 => {
                    varint(number << 3 | 1, &mut out);
                    out.extend(value.to_le_bytes());
                }
                2 => {
                    varint(number << 3 | 5, &mut out);
                    out.extend((value as u32).to_le_bytes());
                }
                _ => {
                    varint(number << 3 | 2, &mut out);
                    varint(bytes.len() as u64, &mut out);
                    out.extend(bytes);
                }
            }
            out
        })
}

/// A random protobuf message: a few well-formed fields with random values, or random bytes.
pub fn message() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::collection::vec(field(), 0..6).prop_map(|f| f.concat()),
        1 => proptest::collection::vec(any::<u8>(), 0..200),
    ]
}
