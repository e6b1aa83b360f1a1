//! Seeded mutations: of JSON values (structure-aware: replace, delete or add a key, change a
//! number to an edge value, nest), of TOML-like text line by line (`key = value` lines get edge
//! values, lines are dropped, duplicated or swapped), and of raw bytes (flip, insert, delete,
//! truncate, splice). The same seed gives the same input, so a finding reproduces from its
//! case number.

use serde_json::{Map, Number, Value};

/// splitmix64: small, seedable, good enough to spread mutations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` ≥ 1).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Numbers at the edges: zero, one, signs, powers of two around the integer widths, floats
/// that round to 0 or ∞ in f32, the largest f64.
const EDGE_NUMBERS: &[f64] = &[
    0.0,
    1.0,
    -1.0,
    2.0,
    3.0,
    7.0,
    255.0,
    65_535.0,
    65_536.0,
    2_147_483_647.0,
    2_147_483_648.0,
    4_294_967_295.0,
    4_294_967_296.0,
    9_007_199_254_740_992.0,
    9.223_372_036_854_776e18,
    1.844_674_407_370_955_2e19,
    1e-50,
    1e-45,
    1e39,
    1e308,
    -1e308,
    0.5,
    -0.0,
];

fn edge_value(rng: &mut Rng) -> Value {
    match rng.below(10) {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => Value::String(
            rng.pick(&["", "silu", "gelu", "llama", "qwen3_next", "∞", "1e999"])
                .to_string(),
        ),
        3 => Value::Array(Vec::new()),
        4 => Value::Object(Map::new()),
        5 => Value::Array(vec![Value::from(1); 1 + rng.below(70)]),
        _ => {
            let x = *rng.pick(EDGE_NUMBERS);
            if x.fract() == 0.0 && x.abs() < 1.8e19 && rng.below(2) == 0 {
                if x >= 0.0 {
                    Value::Number(Number::from(x as u64))
                } else {
                    Value::Number(Number::from(x as i64))
                }
            } else {
                Number::from_f64(x).map_or(Value::Null, Value::Number)
            }
        }
    }
}

/// Every path to a value inside `v` (object keys and array indices).
fn paths(v: &Value, prefix: &mut Vec<PathPart>, out: &mut Vec<Vec<PathPart>>) {
    out.push(prefix.clone());
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                prefix.push(PathPart::Key(k.clone()));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                prefix.push(PathPart::Index(i));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone)]
enum PathPart {
    Key(String),
    Index(usize),
}

fn at_mut<'a>(v: &'a mut Value, path: &[PathPart]) -> Option<&'a mut Value> {
    let mut cur = v;
    for part in path {
        cur = match (part, cur) {
            (PathPart::Key(k), Value::Object(m)) => m.get_mut(k)?,
            (PathPart::Index(i), Value::Array(a)) => a.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// One to three structure-aware mutations of a JSON document.
pub fn mutate_json(doc: &Value, rng: &mut Rng) -> Value {
    let mut v = doc.clone();
    for _ in 0..1 + rng.below(3) {
        let mut all = Vec::new();
        paths(&v, &mut Vec::new(), &mut all);
        let path = rng.pick(&all).clone();
        let Some(target) = at_mut(&mut v, &path) else {
            continue;
        };
        match rng.below(6) {
            0..=2 => *target = edge_value(rng),
            3 => {
                if let Value::Object(m) = target {
                    if let Some(k) = m.keys().nth(rng.below(m.len().max(1))).cloned() {
                        m.remove(&k);
                    }
                }
            }
            4 => {
                if let Value::Object(m) = target {
                    let key = rng.pick(&[
                        "fuzz_unknown",
                        "head_dim",
                        "layer_types",
                        "rope_scaling",
                        "num_experts",
                        "sliding_window",
                    ]);
                    m.insert(key.to_string(), edge_value(rng));
                }
            }
            _ => {
                // Nest: the value wrapped in an array or an object.
                let inner = target.take();
                *target = if rng.below(2) == 0 {
                    Value::Array(vec![inner])
                } else {
                    let mut m = Map::new();
                    m.insert("v".to_string(), inner);
                    Value::Object(m)
                };
            }
        }
    }
    v
}

/// Line-level mutations of TOML text: a `key = value` line's value replaced by an edge value,
/// lines dropped, duplicated or swapped.
pub fn mutate_toml(text: &str, rng: &mut Rng) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        return text.to_string();
    }
    const VALUES: &[&str] = &[
        "0",
        "-1",
        "4294967296",
        "9223372036854775807",
        "1e999",
        "nan",
        "\"\"",
        "[]",
        "{}",
        "\"route:gdn_even_pich\"",
        "[\"decode\", \"nope\"]",
        "\"gemv::\"",
        "\"::x\"",
        "\"differs\"",
        "{ lever = \"fast_exp\", tolerance = -1 }",
        "true",
        "[{ op = \"linear\", role = \"q_prj\" }]",
    ];
    for _ in 0..1 + rng.below(3) {
        let i = rng.below(lines.len());
        match rng.below(5) {
            0 | 1 => {
                if let Some(eq) = lines[i].find(" = ") {
                    let key = lines[i][..eq].to_string();
                    lines[i] = format!("{key} = {}", rng.pick(VALUES));
                }
            }
            2 => {
                lines.remove(i);
                if lines.is_empty() {
                    break;
                }
            }
            3 => {
                let line = lines[i].clone();
                lines.insert(i, line);
            }
            _ => {
                let j = rng.below(lines.len());
                lines.swap(i, j);
            }
        }
    }
    lines.join("\n")
}

/// Byte-level mutations: flip, insert, delete, truncate, or splice in an edge token.
pub fn mutate_bytes(bytes: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(b.len() + 1);
        match rng.below(5) {
            0 if !b.is_empty() => {
                let i = at.min(b.len() - 1);
                b[i] ^= 1 << rng.below(8);
            }
            1 => b.insert(at, rng.next() as u8),
            2 if at < b.len() => {
                b.remove(at);
            }
            3 => b.truncate(at),
            _ => {
                const TOKENS: &[&[u8]] = &[
                    b"\xff\xff\xff\xff\xff\xff\xff\x7f",
                    b"99999999999999999999",
                    b"\0",
                    b"{\"",
                    b"]]]]",
                    b"-",
                ];
                let token = *rng.pick(TOKENS);
                let at = at.min(b.len());
                b.splice(at..at, token.iter().copied());
            }
        }
    }
    b
}

/// Arbitrary bytes of up to `max` length.
pub fn random_bytes(rng: &mut Rng, max: usize) -> Vec<u8> {
    let len = rng.below(max + 1);
    (0..len).map(|_| rng.next() as u8).collect()
}
