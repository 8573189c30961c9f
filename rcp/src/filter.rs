//! `--exclude`, `--include` and `--exclude-from`, with rsync's pattern
//! rules, sans I/O. Paths are the entries' (the source's name first, `/`
//! between components), which are the names rsync matches for the same
//! copy into an existing directory.
//!
//! The rules, as rsync's:
//! - The first rule that matches decides; no match includes.
//! - A pattern starting with `/` is anchored at the top of the copy;
//!   otherwise it matches the end of the path, at a component boundary
//!   (so a pattern without a `/` matches the last component).
//! - A pattern ending with `/` matches only directories.
//! - `*` matches within one component, `**` across components, `?` one
//!   character other than `/`, `[...]` a class (`[!...]` or `[^...]`
//!   negated), `\` quotes the next character (in a pattern with a
//!   wildcard; one without is literal throughout); `dir/***` matches
//!   `dir` and everything beneath it.
//! - An excluded directory is not descended into.
//!
//! Patterns become anchored regular expressions (the `regex` crate, on
//! bytes: names need not be UTF-8). A glob crate such as `globset` was
//! the first choice, but it cannot express rsync's `**` inside a
//! component (`foo**`); rsync's wildcards translate to regexes exactly.

use regex::bytes::Regex;

/// Most rules one copy carries, and the longest pattern (they travel in
/// the request).
pub const MAX_RULES: usize = 1024;
pub const MAX_PATTERN: usize = 4096;

/// One rule as written: include or exclude, and its pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleText {
    pub include: bool,
    pub pattern: Vec<u8>,
}

#[derive(Debug, Clone)]
struct Rule {
    include: bool,
    dir_only: bool,
    regex: Regex,
}

/// A rule list, compiled.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    rules: Vec<Rule>,
    texts: Vec<RuleText>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("empty pattern")]
    Empty,
    #[error("pattern longer than {MAX_PATTERN} bytes")]
    TooLong,
    #[error("more than {MAX_RULES} filter rules")]
    TooMany,
    #[error("pattern {pattern:?}: unclosed [ class")]
    UnclosedClass { pattern: String },
    #[error("pattern {pattern:?}: {why}")]
    Invalid { pattern: String, why: String },
}

impl Filter {
    pub fn new(texts: Vec<RuleText>) -> Result<Filter, FilterError> {
        if texts.len() > MAX_RULES {
            return Err(FilterError::TooMany);
        }
        let rules = texts.iter().map(compile).collect::<Result<_, _>>()?;
        Ok(Filter { rules, texts })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rules as written (to send to the other side).
    pub fn texts(&self) -> &[RuleText] {
        &self.texts
    }

    /// Whether entry `path` (a directory if `is_dir`) is left out.
    pub fn excludes(&self, path: &[u8], is_dir: bool) -> bool {
        self.rules
            .iter()
            .find(|r| (is_dir || !r.dir_only) && r.regex.is_match(path))
            .is_some_and(|r| !r.include)
    }
}

/// Rules from the lines of an `--exclude-from` file: blank lines and
/// lines starting with `;` or `#` are skipped, `+ ` starts an include and
/// `- ` an exclude, any other line is an exclude pattern.
pub fn parse_lines(text: &[u8]) -> Vec<RuleText> {
    text.split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter(|l| !l.is_empty() && !l.starts_with(b";") && !l.starts_with(b"#"))
        .map(|l| match l {
            [b'+', b' ', rest @ ..] => RuleText {
                include: true,
                pattern: rest.to_vec(),
            },
            [b'-', b' ', rest @ ..] => RuleText {
                include: false,
                pattern: rest.to_vec(),
            },
            _ => RuleText {
                include: false,
                pattern: l.to_vec(),
            },
        })
        .collect()
}

fn compile(t: &RuleText) -> Result<Rule, FilterError> {
    let shown = || String::from_utf8_lossy(&t.pattern).into_owned();
    let mut p: &[u8] = &t.pattern;
    if p.is_empty() {
        return Err(FilterError::Empty);
    }
    if p.len() > MAX_PATTERN {
        return Err(FilterError::TooLong);
    }
    let anchored = p.starts_with(b"/");
    if anchored {
        p = &p[1..];
    }
    let dir_only = p.len() > 1 && p.ends_with(b"/");
    if dir_only {
        p = &p[..p.len() - 1];
    }
    // `dir/***`: the directory and everything beneath it.
    let (p, and_beneath) = match p.strip_suffix(b"/***") {
        Some(stem) => (stem, true),
        None => (p, false),
    };
    let mut re = String::from(if anchored { "(?s-u)^" } else { "(?s-u)(?:^|/)" });
    // As rsync: without a wildcard a pattern is literal, backslashes too.
    if p.iter().any(|b| matches!(b, b'*' | b'?' | b'[')) {
        re.push_str(&wildcards(p).ok_or_else(|| FilterError::UnclosedClass { pattern: shown() })?);
    } else {
        re.extend(p.iter().map(|&b| byte(b)));
    }
    if and_beneath {
        re.push_str("(?:/.*)?");
    }
    re.push('$');
    let regex = Regex::new(&re).map_err(|e| FilterError::Invalid {
        pattern: shown(),
        why: e.to_string(),
    })?;
    Ok(Rule {
        include: t.include,
        dir_only,
        regex,
    })
}

/// A wildcard pattern (`*`, `?`, `[...]`, as in the rules) that matches
/// a whole name such as a user's, never a part of one; `None` for an
/// unclosed class.
pub(crate) fn name_pattern(pattern: &[u8]) -> Option<Regex> {
    let re = format!("(?s-u)^(?:{})$", wildcards(pattern)?);
    Regex::new(&re).ok()
}

/// rsync's wildcards as a regex (bytes mode); `None` for an unclosed
/// class.
fn wildcards(p: &[u8]) -> Option<String> {
    let mut out = String::new();
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            b'*' if p.get(i + 1) == Some(&b'*') => {
                out.push_str(".*");
                while p.get(i) == Some(&b'*') {
                    i += 1;
                }
                continue;
            }
            b'*' => out.push_str("[^/]*"),
            b'?' => out.push_str("[^/]"),
            b'[' => {
                let (class, next) = class(p, i)?;
                out.push_str(&class);
                i = next;
                continue;
            }
            b'\\' if i + 1 < p.len() => {
                i += 1;
                out.push_str(&byte(p[i]));
            }
            b => out.push_str(&byte(b)),
        }
        i += 1;
    }
    Some(out)
}

/// The class starting at `p[start] == b'['`, and where it ends. rsync's
/// classes never match `/`: the class is intersected with `[^/]`.
fn class(p: &[u8], start: usize) -> Option<(String, usize)> {
    let mut i = start + 1;
    let mut out = String::from("[[");
    if matches!(p.get(i), Some(b'!' | b'^')) {
        out.push('^');
        i += 1;
    }
    // A `]` first is a member, not the end.
    let first = i;
    loop {
        let b = *p.get(i)?;
        if b == b']' && i > first {
            break;
        }
        if b == b'[' && p.get(i + 1) == Some(&b':') {
            // A named class, `[:alpha:]`.
            let len = p[i..].windows(2).position(|w| w == b":]")? + 2;
            let name = std::str::from_utf8(&p[i..i + len]).ok()?;
            if !name[2..name.len() - 2]
                .bytes()
                .all(|c| c.is_ascii_lowercase())
            {
                return None;
            }
            out.push_str(name);
            i += len;
            continue;
        }
        if b == b'-' && i > first && p.get(i + 1).is_some_and(|&n| n != b']') {
            out.push('-');
        } else {
            out.push_str(&byte(b));
        }
        i += 1;
    }
    out.push_str("]&&[^/]]");
    Some((out, i + 1))
}

/// One literal byte, escaped for the regex.
fn byte(b: u8) -> String {
    if b.is_ascii_alphanumeric() {
        (b as char).to_string()
    } else {
        format!("\\x{b:02x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn filter(rules: &[(&str, bool)]) -> Filter {
        Filter::new(
            rules
                .iter()
                .map(|(p, include)| RuleText {
                    include: *include,
                    pattern: p.as_bytes().to_vec(),
                })
                .collect(),
        )
        .unwrap()
    }

    fn ex(pattern: &str) -> Filter {
        filter(&[(pattern, false)])
    }

    #[test]
    fn a_pattern_without_a_slash_matches_the_last_component() {
        let f = ex("*.o");
        assert!(f.excludes(b"src/a.o", false));
        assert!(f.excludes(b"a.o", false));
        assert!(!f.excludes(b"src/a.o/x", false), "only the last component");
        assert!(!f.excludes(b"src/a.c", false));
        assert!(ex("core").excludes(b"src/deep/core", false));
        assert!(!ex("core").excludes(b"src/deep/core2", false));
    }

    #[test]
    fn anchored_slashed_and_double_star_patterns() {
        assert!(ex("/src/tmp").excludes(b"src/tmp", true));
        assert!(!ex("/src/tmp").excludes(b"x/src/tmp", true), "anchored");
        // Unanchored with a slash: the end of the path, at a boundary.
        assert!(ex("src/tmp").excludes(b"x/src/tmp", true));
        assert!(!ex("src/tmp").excludes(b"x/nosrc/tmp", true));
        // `*` stays in its component, `**` crosses them.
        assert!(!ex("/src/*/x").excludes(b"src/a/b/x", false));
        assert!(ex("/src/*/x").excludes(b"src/a/x", false));
        assert!(ex("/src/**/x").excludes(b"src/a/b/x", false));
        assert!(ex("foo**").excludes(b"a/foobar/baz", false));
        assert!(ex("?").excludes(b"a/b", false));
        assert!(!ex("a?b").excludes(b"a/b", false), "? is not /");
    }

    #[test]
    fn trailing_slash_means_directories_and_triple_star_their_contents() {
        let f = ex("cache/");
        assert!(f.excludes(b"src/cache", true));
        assert!(!f.excludes(b"src/cache", false), "a file named cache stays");
        let f = ex("/src/keep/***");
        assert!(f.excludes(b"src/keep", true));
        assert!(f.excludes(b"src/keep/a/b", false));
        assert!(!f.excludes(b"src/keeper", false));
    }

    #[test]
    fn classes_and_quoting() {
        assert!(ex("[ab].txt").excludes(b"a.txt", false));
        assert!(!ex("[ab].txt").excludes(b"c.txt", false));
        assert!(ex("[!ab].txt").excludes(b"c.txt", false));
        assert!(ex("[^ab].txt").excludes(b"c.txt", false));
        assert!(ex("f[0-9]").excludes(b"f7", false));
        assert!(ex("[]x]").excludes(b"]", false), "] first is a member");
        assert!(ex("[[:digit:]]z").excludes(b"3z", false));
        assert!(!ex("a[!x]b").excludes(b"a/b", false), "a class is never /");
        assert!(ex(r"\*").excludes(b"*", false));
        assert!(ex(r"a\]").excludes(br"a\]", false), "no wildcard: literal");
        assert!(!ex(r"a\]").excludes(b"a]", false));
        assert!(!ex(r"\*").excludes(b"x", false));
        assert!(ex("a.b").excludes(b"a.b", false));
        assert!(!ex("a.b").excludes(b"axb", false), "a dot is a dot");
        assert!(ex("\u{fc}*").excludes("\u{fc}ber".as_bytes(), false));
        assert!(ex("b\\x*").excludes(b"bxff", false), "a quoted x is an x");
        assert!(
            ex("b?").excludes(b"b\xff", false),
            "names need not be UTF-8"
        );
    }

    #[test]
    fn the_first_match_wins() {
        let f = filter(&[("*.keep", true), ("*", false)]);
        assert!(!f.excludes(b"src/a.keep", false));
        assert!(f.excludes(b"src/a.other", false));
        let f = filter(&[("*", false), ("*.keep", true)]);
        assert!(f.excludes(b"src/a.keep", false));
        assert!(!Filter::default().excludes(b"anything", false));
    }

    #[test]
    fn bad_patterns_say_what_is_wrong() {
        let one = |p: &str| {
            Filter::new(vec![RuleText {
                include: false,
                pattern: p.as_bytes().to_vec(),
            }])
        };
        assert_eq!(one("").unwrap_err(), FilterError::Empty);
        assert!(matches!(
            one("a[bc").unwrap_err(),
            FilterError::UnclosedClass { .. }
        ));
        assert!(matches!(
            one("[[:nope").unwrap_err(),
            FilterError::UnclosedClass { .. }
        ));
        assert_eq!(
            one(&"x".repeat(MAX_PATTERN + 1)).unwrap_err(),
            FilterError::TooLong
        );
        let many = vec![
            RuleText {
                include: false,
                pattern: b"x".to_vec()
            };
            MAX_RULES + 1
        ];
        assert_eq!(Filter::new(many).unwrap_err(), FilterError::TooMany);
    }

    #[test]
    fn exclude_from_lines() {
        let rules = parse_lines(b"# comment\n; also\n\n+ *.c\n- *.o\nplain\r\n");
        let want = [(true, "*.c"), (false, "*.o"), (false, "plain")];
        assert_eq!(rules.len(), 3);
        for (r, (include, p)) in rules.iter().zip(want) {
            assert_eq!((r.include, r.pattern.as_slice()), (include, p.as_bytes()));
        }
    }

    proptest! {
        #[test]
        fn any_pattern_compiles_or_is_refused_and_never_panics(
            p in proptest::collection::vec(any::<u8>(), 1..40),
            path in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            if let Ok(f) = Filter::new(vec![RuleText { include: false, pattern: p }]) {
                let _ = f.excludes(&path, false);
            }
        }

        #[test]
        fn a_literal_name_matches_itself_and_only_itself(
            name in "[a-zA-Z0-9._-]{1,12}",
            other in "[a-zA-Z0-9._-]{1,12}",
        ) {
            let f = ex(&name);
            let (mine, theirs) = (format!("top/{name}"), format!("top/{other}"));
            prop_assert!(f.excludes(mine.as_bytes(), false));
            prop_assert_eq!(f.excludes(theirs.as_bytes(), false), other == name);
        }
    }
}
