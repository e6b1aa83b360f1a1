//! The `re:` entries of a compressed-tensors `ignore` list, matched as vLLM matches them
//! (`re.match`: anchored at the start of the module path, at its end only with a final `$`).
//! Only the regex syntax published checkpoints use is accepted (`.*`, `.`, `\.`-style escapes,
//! a final `$`); any other pattern is refused at parse, naming the entry, rather than matched
//! differently from vLLM.

/// One element of a parsed pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    /// A character that matches itself (plain, or escaped with `\`).
    Literal(char),
    /// `.`: any one character.
    AnyChar,
    /// `.*`: any run of characters.
    AnyRun,
}

/// A `re:` pattern: its tokens and whether it ends in `$` (must match the whole path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pattern {
    tokens: Vec<Token>,
    anchored_end: bool,
}

/// Characters that are regex syntax; outside the forms above they refuse the pattern.
const META: &[char] = &[
    '^', '$', '*', '+', '?', '(', ')', '[', ']', '{', '}', '|', '\\',
];

impl Pattern {
    /// Parses the text after `re:`; `Err` says which syntax is not modelled.
    pub(crate) fn parse(pattern: &str) -> Result<Pattern, String> {
        let mut tokens = Vec::new();
        let mut anchored_end = false;
        let mut chars = pattern.chars().peekable();
        while let Some(c) = chars.next() {
            if anchored_end {
                return Err("`$` other than at the end".to_string());
            }
            match c {
                '.' if chars.peek() == Some(&'*') => {
                    chars.next();
                    tokens.push(Token::AnyRun);
                }
                '.' => tokens.push(Token::AnyChar),
                '\\' => match chars.next() {
                    Some(escaped) if !escaped.is_ascii_alphanumeric() => {
                        tokens.push(Token::Literal(escaped))
                    }
                    Some(class) => return Err(format!("the escape `\\{class}`")),
                    None => return Err("a trailing `\\`".to_string()),
                },
                '$' => anchored_end = true,
                c if META.contains(&c) => return Err(format!("`{c}`")),
                c => tokens.push(Token::Literal(c)),
            }
        }
        Ok(Pattern {
            tokens,
            anchored_end,
        })
    }

    /// Whether the pattern matches a prefix of `text` (all of it with a final `$`), as
    /// Python's `re.match`.
    pub(crate) fn matches(&self, text: &str) -> bool {
        let text: Vec<char> = text.chars().collect();
        // reachable[j]: the tokens so far can consume exactly text[..j] (O(tokens * chars)).
        let mut reachable = vec![false; text.len() + 1];
        reachable[0] = true;
        for token in &self.tokens {
            let mut next = vec![false; text.len() + 1];
            match token {
                Token::AnyRun => {
                    let mut seen = false;
                    for j in 0..=text.len() {
                        seen |= reachable[j];
                        next[j] = seen;
                    }
                }
                Token::AnyChar | Token::Literal(_) => {
                    for j in 0..text.len() {
                        let fits = match token {
                            Token::Literal(c) => text[j] == *c,
                            _ => true,
                        };
                        next[j + 1] = reachable[j] && fits;
                    }
                }
            }
            reachable = next;
        }
        if self.anchored_end {
            reachable[text.len()]
        } else {
            reachable.iter().any(|r| *r)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Pattern;

    fn matches(pattern: &str, text: &str) -> bool {
        Pattern::parse(pattern)
            .expect("a modelled pattern")
            .matches(text)
    }

    #[test]
    fn patterns_match_as_re_match() {
        assert!(matches(".*lm_head", "lm_head"));
        assert!(matches(".*mlp\\.gate$", "model.layers.3.mlp.gate"));
        assert!(!matches(".*mlp\\.gate$", "model.layers.3.mlp.gate_proj"));
        // Without `$`, re.match takes a prefix: this also matches gate_proj, as in vLLM.
        assert!(matches(".*mlp.gate", "model.layers.3.mlp.gate_proj"));
        assert!(matches("model.*.q_proj", "model.layers.0.self_attn.q_proj"));
        assert!(!matches("lm_head", "model.lm_head"));
        assert!(matches(
            ".*linear_attn.*",
            "model.layers.0.linear_attn.out_proj"
        ));
        assert!(matches("model.layers.1.", "model.layers.1x"));
        assert!(!matches("model\\.layers", "modelXlayers"));
    }

    #[test]
    fn other_regex_syntax_is_refused() {
        for bad in [
            "model\\.layers\\.[0-2]\\..*",
            ".*(gate|up)_proj",
            "^lm_head",
            "a+",
            "lm_head$x",
            ".*\\d+",
            "x\\",
        ] {
            assert!(Pattern::parse(bad).is_err(), "{bad}");
        }
    }
}
