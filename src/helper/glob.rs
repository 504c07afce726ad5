//! Doublestar glob patterns for `file.glob` and the file filter of `file.grep`
//! (k8s-executor §4.3): `**` (any number of whole path segments), `*` (any run of characters
//! within a segment), `?` (one character), `[..]` classes (`!` or `^` negates, `a-z` ranges,
//! a `]` first in the class is literal), `{a,b}` alternatives (nested allowed) and `\` escapes.
//!
//! Matching is pure and bounded: braces expand to at most [`MAX_ALTERNATIVES`] alternatives,
//! segments match in O(pattern × name) and paths in O(segments × depth), so no pattern can make
//! the helper hang. A segment that is exactly `**` matches zero or more segments; `**` inside a
//! longer segment behaves like `*`. Hidden names are matched like any other.

/// Most alternatives a pattern's braces may expand to.
pub const MAX_ALTERNATIVES: usize = 256;

/// Why a pattern is refused (the helper answers `internal`, as the spec says for a bad glob).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// A `[` without its `]`.
    #[error("unclosed character class")]
    UnclosedClass,
    /// A `{` without its `}`.
    #[error("unclosed alternative")]
    UnclosedBrace,
    /// A `\` at the end of the pattern.
    #[error("dangling escape")]
    DanglingEscape,
    /// The braces expand to more than [`MAX_ALTERNATIVES`] alternatives.
    #[error("pattern has too many alternatives")]
    TooManyAlternatives,
}

/// One element of a segment pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Literal(char),
    AnyRun,
    AnyOne,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// One `/`-separated segment of a pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    AnyDepth,
    Name(Vec<Token>),
}

/// A compiled doublestar pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobPattern {
    alternatives: Vec<Vec<Segment>>,
}

impl GlobPattern {
    /// Compiles `pattern`. A leading `/` and `./` are stripped; an empty or `.` pattern compiles
    /// to one that matches nothing.
    pub fn new(pattern: &str) -> Result<Self, PatternError> {
        let mut trimmed = pattern;
        loop {
            if let Some(rest) = trimmed.strip_prefix('/') {
                trimmed = rest;
            } else if let Some(rest) = trimmed.strip_prefix("./") {
                trimmed = rest;
            } else {
                break;
            }
        }
        if trimmed.is_empty() || trimmed == "." {
            return Ok(Self {
                alternatives: Vec::new(),
            });
        }
        let mut alternatives = Vec::new();
        for expanded in expand_braces(trimmed)? {
            let segments = expanded
                .split('/')
                .filter(|s| !s.is_empty() && *s != ".")
                .map(compile_segment)
                .collect::<Result<Vec<_>, _>>()?;
            if !segments.is_empty() {
                alternatives.push(segments);
            }
        }
        Ok(Self { alternatives })
    }

    /// True if the root-relative path whose segments are `path` matches.
    pub fn matches(&self, path: &[&str]) -> bool {
        self.alternatives
            .iter()
            .any(|segments| reachable_ends(segments, path)[segments.len()])
    }

    /// True if some path strictly below the directory `dir` could match, so the walk must
    /// descend into it.
    pub fn may_match_below(&self, dir: &[&str]) -> bool {
        self.alternatives.iter().any(|segments| {
            let ends = reachable_ends(segments, dir);
            ends[..segments.len()].iter().any(|&reached| reached)
        })
    }
}

/// Which pattern positions are reachable after consuming all of `path` (index = number of
/// pattern segments consumed).
fn reachable_ends(segments: &[Segment], path: &[&str]) -> Vec<bool> {
    let mut current = vec![false; segments.len() + 1];
    current[0] = true;
    close_any_depth(segments, &mut current);
    for name in path {
        let mut next = vec![false; segments.len() + 1];
        for (index, segment) in segments.iter().enumerate() {
            if !current[index] {
                continue;
            }
            match segment {
                Segment::AnyDepth => next[index] = true,
                Segment::Name(tokens) if name_matches(tokens, name) => next[index + 1] = true,
                Segment::Name(_) => {}
            }
        }
        close_any_depth(segments, &mut next);
        current = next;
    }
    current
}

/// A `**` may match zero segments: reaching it also reaches the position after it.
fn close_any_depth(segments: &[Segment], reached: &mut [bool]) {
    for index in 0..segments.len() {
        if reached[index] && segments[index] == Segment::AnyDepth {
            reached[index + 1] = true;
        }
    }
}

/// Matches one name against one segment pattern: the classic single-backtrack wildcard
/// algorithm, O(tokens × characters).
fn name_matches(tokens: &[Token], name: &str) -> bool {
    let chars: Vec<char> = name.chars().collect();
    let (mut t, mut c) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while c < chars.len() {
        match tokens.get(t) {
            Some(Token::AnyRun) => {
                star = Some((t, c));
                t += 1;
                continue;
            }
            Some(token) if token_matches(token, chars[c]) => {
                t += 1;
                c += 1;
                continue;
            }
            _ => {}
        }
        match star {
            Some((star_t, star_c)) => {
                t = star_t + 1;
                c = star_c + 1;
                star = Some((star_t, star_c + 1));
            }
            None => return false,
        }
    }
    tokens[t..].iter().all(|token| *token == Token::AnyRun)
}

fn token_matches(token: &Token, ch: char) -> bool {
    match token {
        Token::Literal(expected) => *expected == ch,
        Token::AnyOne => true,
        Token::AnyRun => false,
        Token::Class { negated, ranges } => {
            ranges.iter().any(|&(low, high)| low <= ch && ch <= high) != *negated
        }
    }
}

fn compile_segment(segment: &str) -> Result<Segment, PatternError> {
    if segment == "**" {
        return Ok(Segment::AnyDepth);
    }
    let mut tokens = Vec::new();
    let mut chars = segment.chars().peekable();
    while let Some(ch) = chars.next() {
        let token = match ch {
            '*' => {
                while chars.peek() == Some(&'*') {
                    chars.next();
                }
                Token::AnyRun
            }
            '?' => Token::AnyOne,
            '\\' => Token::Literal(chars.next().ok_or(PatternError::DanglingEscape)?),
            '[' => compile_class(&mut chars)?,
            other => Token::Literal(other),
        };
        tokens.push(token);
    }
    Ok(Segment::Name(tokens))
}

fn compile_class(chars: &mut impl Iterator<Item = char>) -> Result<Token, PatternError> {
    // (character, escaped) pairs up to the closing `]`.
    let mut items: Vec<(char, bool)> = Vec::new();
    let mut negated = false;
    loop {
        let ch = chars.next().ok_or(PatternError::UnclosedClass)?;
        match ch {
            '!' | '^' if items.is_empty() && !negated => negated = true,
            ']' if !items.is_empty() => break,
            '\\' => items.push((chars.next().ok_or(PatternError::DanglingEscape)?, true)),
            other => items.push((other, false)),
        }
    }
    // An unescaped `-` between two items makes a range; at either end it is literal.
    let mut ranges = Vec::new();
    let mut index = 0;
    while index < items.len() {
        let low = items[index].0;
        if items.get(index + 1) == Some(&('-', false)) && index + 2 < items.len() {
            ranges.push((low, items[index + 2].0));
            index += 3;
        } else {
            ranges.push((low, low));
            index += 1;
        }
    }
    Ok(Token::Class { negated, ranges })
}

/// Expands `{a,b}` alternatives (outside classes, not escaped), innermost choices multiplied
/// out, bounded by [`MAX_ALTERNATIVES`]. Escapes are kept for the segment compiler.
fn expand_braces(pattern: &str) -> Result<Vec<String>, PatternError> {
    let Some((open, close)) = first_brace_group(pattern)? else {
        return Ok(vec![pattern.to_owned()]);
    };
    let prefix = &pattern[..open];
    let suffix = &pattern[close + 1..];
    let mut expanded = Vec::new();
    for choice in split_top_level(&pattern[open + 1..close]) {
        for rest in expand_braces(&format!("{prefix}{choice}{suffix}"))? {
            expanded.push(rest);
            if expanded.len() > MAX_ALTERNATIVES {
                return Err(PatternError::TooManyAlternatives);
            }
        }
    }
    Ok(expanded)
}

/// Byte offsets of the first top-level `{` and its matching `}`.
fn first_brace_group(pattern: &str) -> Result<Option<(usize, usize)>, PatternError> {
    let bytes = pattern.as_bytes();
    let (mut index, mut depth, mut open, mut in_class) = (0, 0usize, None, false);
    while index < bytes.len() {
        match bytes[index] {
            b'\\' => index += 1,
            b'[' if !in_class => in_class = true,
            b']' if in_class => in_class = false,
            b'{' if !in_class => {
                if depth == 0 {
                    open = Some(index);
                }
                depth += 1;
            }
            b'}' if !in_class && depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    return Ok(open.map(|open| (open, index)));
                }
            }
            _ => {}
        }
        index += 1;
    }
    if depth > 0 {
        return Err(PatternError::UnclosedBrace);
    }
    Ok(None)
}

/// Splits the inside of a brace group on its top-level commas.
fn split_top_level(inner: &str) -> Vec<&str> {
    let bytes = inner.as_bytes();
    let (mut parts, mut start, mut depth, mut index) = (Vec::new(), 0, 0usize, 0);
    while index < bytes.len() {
        match bytes[index] {
            b'\\' => index += 1,
            b'{' => depth += 1,
            b'}' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => {
                parts.push(&inner[start..index]);
                start = index + 1;
            }
            _ => {}
        }
        index += 1;
    }
    parts.push(&inner[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, path: &str) -> bool {
        let segments: Vec<&str> = path.split('/').collect();
        GlobPattern::new(pattern).unwrap().matches(&segments)
    }

    #[test]
    fn single_star_and_question_mark_stay_within_a_segment() {
        assert!(matches("*.rs", "main.rs"));
        assert!(!matches("*.rs", "src/main.rs"));
        assert!(matches("src/*.rs", "src/main.rs"));
        assert!(matches("?.txt", "a.txt"));
        assert!(!matches("?.txt", "ab.txt"));
        assert!(matches("*", ".hidden"));
        assert!(matches("a*b*c", "axxbyyc"));
        assert!(!matches("a*b*c", "axxbyy"));
    }

    #[test]
    fn double_star_matches_zero_or_more_whole_segments() {
        assert!(matches("**/*.rs", "main.rs"));
        assert!(matches("**/*.rs", "a/b/c/main.rs"));
        assert!(matches("a/**/b", "a/b"));
        assert!(matches("a/**/b", "a/x/y/b"));
        assert!(!matches("a/**/b", "a/x/y/c"));
        assert!(matches("**", "any/depth/at/all"));
        assert!(matches("a**.rs", "abc.rs"), "** inside a segment is *");
        assert!(!matches("a**.rs", "a/b.rs"));
    }

    #[test]
    fn classes_support_ranges_negation_and_literal_brackets() {
        assert!(matches("[a-c].txt", "b.txt"));
        assert!(!matches("[a-c].txt", "d.txt"));
        assert!(matches("[!a-c].txt", "d.txt"));
        assert!(matches("[^a-c].txt", "d.txt"));
        assert!(matches("[]x]", "]"));
        assert!(matches("[a-]", "-"));
        // Only a leading `!` or `^` negates; anywhere else it is a literal.
        assert!(matches("[a!]", "!"));
        assert!(!matches("[a!]", "b"));
        assert!(matches("[a^]", "^"));
        assert!(!matches("[!!]", "!"));
        assert!(matches("[!!]", "x"));
        assert!(matches("\\*", "*"));
        assert!(!matches("\\*", "x"));
    }

    #[test]
    fn braces_expand_to_alternatives_including_nested_ones() {
        assert!(matches("*.{rs,toml}", "Cargo.toml"));
        assert!(matches("*.{rs,toml}", "lib.rs"));
        assert!(!matches("*.{rs,toml}", "x.md"));
        assert!(matches("{src,tests/{a,b}}/*.rs", "tests/b/x.rs"));
        assert!(matches("[{]", "{"), "a brace inside a class is literal");
        // A closing brace inside a class, or with no group open, is literal too.
        assert!(matches("{x,[}]}", "}"));
        assert!(matches("{x,[}]}", "x"));
        assert!(!matches("{x,[}]}", "]"));
        assert!(matches("a}b", "a}b"));
        // An escaped comma inside a group is part of its alternative, not a separator.
        assert!(matches("{a\\,b,c}.txt", "a,b.txt"));
        assert!(matches("{a\\,b,c}.txt", "c.txt"));
        assert!(!matches("{a\\,b,c}.txt", "b.txt"));
    }

    #[test]
    fn leading_slash_and_dot_are_stripped_and_empty_matches_nothing() {
        assert!(matches("/a.txt", "a.txt"));
        assert!(matches("./a.txt", "a.txt"));
        assert!(!matches("", "a.txt"));
        assert!(!matches(".", "a.txt"));
    }

    #[test]
    fn bad_and_explosive_patterns_are_refused() {
        assert_eq!(GlobPattern::new("[ab"), Err(PatternError::UnclosedClass));
        assert_eq!(GlobPattern::new("{a,b"), Err(PatternError::UnclosedBrace));
        assert_eq!(GlobPattern::new("a\\"), Err(PatternError::DanglingEscape));
        let explosive = "{a,b}{c,d}{e,f}{g,h}{i,j}{k,l}{m,n}{o,p}{q,r}";
        assert_eq!(
            GlobPattern::new(explosive),
            Err(PatternError::TooManyAlternatives)
        );
    }

    #[test]
    fn the_walk_descends_only_where_a_match_is_possible() {
        let pattern = GlobPattern::new("src/*/x.rs").unwrap();
        assert!(pattern.may_match_below(&[]));
        assert!(pattern.may_match_below(&["src"]));
        assert!(pattern.may_match_below(&["src", "a"]));
        assert!(!pattern.may_match_below(&["docs"]));
        assert!(!pattern.may_match_below(&["src", "a", "b"]));
        assert!(GlobPattern::new("**").unwrap().may_match_below(&["x", "y"]));
    }

    #[test]
    fn pathological_stars_finish_quickly() {
        let pattern = format!("{}b", "*a".repeat(200));
        let name = "a".repeat(3000);
        assert!(!matches(&pattern, &name));
        let deep = format!("{}x", "**/".repeat(100));
        let path = vec!["d"; 500].join("/");
        assert!(!matches(&deep, &path));
    }
}
