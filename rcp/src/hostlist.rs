//! Slurm's hostlist syntax, sans I/O: `node[01-16]`, `n[1-4,7],login2`,
//! `rack[1-2]-gpu[1-4]`. [`expand`] turns one into the host names in
//! order (zero padding kept: `n[08-10]` is `n08 n09 n10`); [`compress`]
//! writes a list of names back in that syntax, so a summary can say
//! `node[01-16]` rather than sixteen names.
//!
//! The grammar: hosts separated by top-level commas; each host is text
//! with any number of bracket groups, each group a comma-separated list
//! of numbers and ranges `LOW-HIGH` (LOW ≤ HIGH); a group's numbers are
//! written as wide as LOW is when LOW has a leading zero (as Slurm does).
//! Several groups multiply out, the last one turning fastest.

use thiserror::Error;

/// The most hosts one list may name: a broadcast to more is not a typo
/// anyone wants expanded.
pub const MAX_HOSTS: usize = 65_536;
/// The longest host name (DNS's 253, with room for a user part).
pub const MAX_NAME: usize = 255;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HostlistError {
    #[error("empty host list")]
    Empty,
    #[error("an empty host name in {0:?}")]
    EmptyHost(String),
    #[error("unclosed '[' in {0:?}")]
    Unclosed(String),
    #[error("a ']' without its '[' in {0:?}")]
    Unopened(String),
    #[error("a '[' inside brackets in {0:?}")]
    Nested(String),
    #[error("{range:?} in {list:?} is not a number or a LOW-HIGH range of numbers")]
    BadRange { range: String, list: String },
    #[error("the range {range:?} in {list:?} goes down (LOW must not exceed HIGH)")]
    Reversed { range: String, list: String },
    #[error("{list:?} names more than {MAX_HOSTS} hosts")]
    TooMany { list: String },
    #[error("the host name {0:?} is longer than {MAX_NAME} bytes")]
    TooLong(String),
    #[error("{0:?} is named twice")]
    Twice(String),
}

/// Whether `text` is written as a host list rather than one host name:
/// it has a bracket group or a top-level comma (an IPv6 literal in
/// brackets, `[::1]`, is a host).
pub fn is_hostlist(text: &str) -> bool {
    text.contains(',') || (text.contains('[') && !text.starts_with('['))
}

/// The host names of `list`, in order; a name given twice is refused.
pub fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    if list.trim().is_empty() {
        return Err(HostlistError::Empty);
    }
    let mut hosts = Vec::new();
    for host in split_top(list)? {
        if host.is_empty() {
            return Err(HostlistError::EmptyHost(list.into()));
        }
        expand_one(host, list, &mut hosts)?;
    }
    let mut seen = std::collections::HashSet::new();
    for h in &hosts {
        if !seen.insert(h.as_str()) {
            return Err(HostlistError::Twice(h.clone()));
        }
    }
    Ok(hosts)
}

/// `list` cut at its top-level commas (those outside brackets).
fn split_top(list: &str) -> Result<Vec<&str>, HostlistError> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0u32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth > 0 => return Err(HostlistError::Nested(list.into())),
            '[' => depth = 1,
            ']' if depth == 0 => return Err(HostlistError::Unopened(list.into())),
            ']' => depth = 0,
            ',' if depth == 0 => {
                parts.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err(HostlistError::Unclosed(list.into()));
    }
    parts.push(list[start..].trim());
    Ok(parts)
}

/// One host pattern's names appended to `out`.
fn expand_one(host: &str, list: &str, out: &mut Vec<String>) -> Result<(), HostlistError> {
    // Literal pieces and bracket groups, alternating: text, group, text...
    let mut texts = Vec::new();
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut rest = host;
    while let Some(open) = rest.find('[') {
        let close = rest[open..].find(']').expect("balanced: checked") + open;
        texts.push(&rest[..open]);
        groups.push(numbers(&rest[open + 1..close], list)?);
        rest = &rest[close + 1..];
    }
    texts.push(rest);
    let total = groups
        .iter()
        .try_fold(1usize, |n, g| n.checked_mul(g.len()))
        .filter(|n| out.len() + n <= MAX_HOSTS)
        .ok_or_else(|| HostlistError::TooMany { list: list.into() })?;
    for mut k in 0..total {
        // Mixed radix, the last group turning fastest.
        let mut picks = vec![0; groups.len()];
        for (g, pick) in groups.iter().zip(picks.iter_mut()).rev() {
            *pick = k % g.len();
            k /= g.len();
        }
        let mut name = String::from(texts[0]);
        for (i, g) in groups.iter().enumerate() {
            name.push_str(&g[picks[i]]);
            name.push_str(texts[i + 1]);
        }
        if name.len() > MAX_NAME {
            return Err(HostlistError::TooLong(name));
        }
        out.push(name);
    }
    Ok(())
}

/// The numbers of one bracket group, written as they are named.
fn numbers(group: &str, list: &str) -> Result<Vec<String>, HostlistError> {
    let mut out = Vec::new();
    for range in group.split(',') {
        let range = range.trim();
        let bad = || HostlistError::BadRange {
            range: range.into(),
            list: list.into(),
        };
        let (low, high) = range.split_once('-').unwrap_or((range, range));
        let digits =
            |s: &str| !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(low) || !digits(high) {
            return Err(bad());
        }
        let (lo, hi): (u64, u64) = (
            low.parse().map_err(|_| bad())?,
            high.parse().map_err(|_| bad())?,
        );
        if lo > hi {
            return Err(HostlistError::Reversed {
                range: range.into(),
                list: list.into(),
            });
        }
        if (hi - lo) as usize >= MAX_HOSTS - out.len().min(MAX_HOSTS) {
            return Err(HostlistError::TooMany { list: list.into() });
        }
        let width = if low.len() > 1 && low.starts_with('0') {
            low.len()
        } else {
            0
        };
        out.extend((lo..=hi).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

/// `hosts` in hostlist syntax: runs of names that differ only in a
/// trailing number of one width become `prefix[a-b,c]`; the order of the
/// names is kept (so [`expand`] gives back exactly `hosts`).
pub fn compress(hosts: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < hosts.len() {
        let Some((prefix, digits)) = split_number(&hosts[i]) else {
            out.push(hosts[i].clone());
            i += 1;
            continue;
        };
        // Names next in order with the same prefix and a number written
        // the same way (padded to one width, or unpadded).
        let padded = |d: &str| d.len() > 1 && d.starts_with('0');
        // One written form per run: padded to the first's width, or none
        // padded (a range's width is its low end's).
        let fits = |d: &str| {
            if padded(digits) {
                d.len() == digits.len()
            } else {
                !padded(d)
            }
        };
        let mut run = vec![digits];
        let mut j = i + 1;
        while j < hosts.len() {
            match split_number(&hosts[j]) {
                Some((p, d)) if p == prefix && fits(d) => {
                    run.push(d);
                    j += 1;
                }
                _ => break,
            }
        }
        if run.len() == 1 {
            out.push(hosts[i].clone());
        } else {
            out.push(format!("{prefix}[{}]", ranges(&run)));
        }
        i = j;
    }
    out.join(",")
}

/// A name's text before its trailing number, and the number's digits.
fn split_number(name: &str) -> Option<(&str, &str)> {
    let at = name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let digits = &name[at..];
    // (Brackets or commas in a name could not be read back.)
    let plain = !name.contains(['[', ']', ',']);
    (plain && !digits.is_empty() && digits.len() <= 18).then_some((&name[..at], digits))
}

/// Numbers as `a-b,c`: consecutive ones (in the order given) as ranges.
fn ranges(digits: &[&str]) -> String {
    let mut parts = Vec::new();
    let mut k = 0;
    while k < digits.len() {
        let first: u64 = digits[k].parse().expect("digits");
        let mut last = k;
        while last + 1 < digits.len()
            && digits[last + 1].parse::<u64>().expect("digits") == first + (last + 1 - k) as u64
        {
            last += 1;
        }
        if last == k {
            parts.push(digits[k].to_string());
        } else {
            parts.push(format!("{}-{}", digits[k], digits[last]));
        }
        k = last + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(list: &str) -> Vec<String> {
        expand(list).unwrap_or_else(|e| panic!("{list}: {e}"))
    }

    #[test]
    fn lists_expand_as_slurm_writes_them() {
        assert_eq!(names("node[01-03]"), ["node01", "node02", "node03"]);
        assert_eq!(
            names("n[1-4,7],login2"),
            ["n1", "n2", "n3", "n4", "n7", "login2"]
        );
        assert_eq!(names("n[8-10]"), ["n8", "n9", "n10"]);
        assert_eq!(names("n[08-10]"), ["n08", "n09", "n10"]);
        assert_eq!(names("n[098-100]"), ["n098", "n099", "n100"]);
        assert_eq!(
            names("rack[1-2]-gpu[1-2]"),
            ["rack1-gpu1", "rack1-gpu2", "rack2-gpu1", "rack2-gpu2"]
        );
        assert_eq!(names("10.0.0.[1-3]"), ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        assert_eq!(names("a,b , c"), ["a", "b", "c"]);
        assert_eq!(names("solo"), ["solo"]);
        assert_eq!(names("x[5]"), ["x5"]);
        assert_eq!(names("[1-2]x"), ["1x", "2x"]);
    }

    #[test]
    fn malformed_lists_are_refused_with_the_reason() {
        let cases = [
            ("", "empty host list"),
            ("a,,b", "an empty host name"),
            ("n[1-3", "unclosed '['"),
            ("n1-3]", "a ']' without its '['"),
            ("n[1[2]]", "a '[' inside brackets"),
            ("n[a-b]", "is not a number"),
            ("n[1-]", "is not a number"),
            ("n[]", "is not a number"),
            ("n[1-2:2]", "is not a number"),
            ("n[5-3]", "goes down"),
            ("n[0-99999]", "more than 65536 hosts"),
            ("n[0-999]-[0-999]", "more than 65536 hosts"),
            ("n[1-3],n2", "\"n2\" is named twice"),
        ];
        for (list, why) in cases {
            let e = expand(list).expect_err(list).to_string();
            assert!(e.contains(why), "{list}: {e}");
        }
        let long = format!("{}[1-2]", "x".repeat(MAX_NAME));
        assert!(matches!(expand(&long), Err(HostlistError::TooLong(_))));
    }

    #[test]
    fn hostlists_are_told_from_host_names() {
        for list in ["node[01-16]", "a,b", "n[1-4,7],login2", "10.0.0.[1-8]"] {
            assert!(is_hostlist(list), "{list}");
        }
        for host in ["node2", "[::1]", "[fe80::1%eth0]", "user.host-1"] {
            assert!(!is_hostlist(host), "{host}");
        }
    }

    #[test]
    fn compressed_lists_read_as_people_write_them() {
        let of = |list: &str| compress(&names(list));
        assert_eq!(of("node[01-16]"), "node[01-16]");
        assert_eq!(of("n[1-4,7],login2"), "n[1-4,7],login2");
        assert_eq!(of("n[8-10]"), "n[8-10]");
        assert_eq!(of("solo"), "solo");
        assert_eq!(of("a1,b1,a2"), "a1,b1,a2");
        // (Found by the property below: a padded name after unpadded ones
        // starts a run of its own.)
        let mixed: Vec<String> = ["n100", "n95", "n096"].map(String::from).into();
        assert_eq!(compress(&mixed), "n[100,95],n096");
        assert_eq!(expand(&compress(&mixed)).unwrap(), mixed);
    }

    /// A host name as the property test writes them: a prefix from a few,
    /// maybe a number of some width.
    fn host() -> impl Strategy<Value = String> {
        (
            prop::sample::select(vec!["node", "n", "gpu-", "login", "r1c"]),
            prop::option::of((0u64..300, 0usize..4)),
        )
            .prop_map(|(prefix, number)| match number {
                Some((n, width)) => format!("{prefix}{n:0width$}"),
                None => prefix.to_string(),
            })
    }

    proptest! {
        /// Any list of distinct names survives compress then expand, in
        /// order (the reference list is the generated one).
        #[test]
        fn compress_then_expand_gives_the_names_back(hosts in prop::collection::vec(host(), 1..60)) {
            let mut seen = std::collections::HashSet::new();
            let hosts: Vec<String> = hosts.into_iter().filter(|h| seen.insert(h.clone())).collect();
            let list = compress(&hosts);
            prop_assert_eq!(expand(&list).unwrap(), hosts, "{}", list);
        }

        /// Whatever the text, expanding it ends in names or a refusal, never
        /// a panic, and never more than the cap.
        #[test]
        fn any_text_expands_or_is_refused(text in "[a-c0-9\\[\\],\\- ]{0,24}") {
            if let Ok(hosts) = expand(&text) {
                prop_assert!(!hosts.is_empty() && hosts.len() <= MAX_HOSTS);
                prop_assert!(hosts.iter().all(|h| !h.is_empty() && !h.contains([',', '[', ']'])));
            }
        }
    }
}
