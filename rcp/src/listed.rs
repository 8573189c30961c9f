//! `--files-from FILE` and `-R`: the names a copy sends, relative to its
//! one source directory, as rsync reads them (sans I/O).
//!
//! * One name a line (NUL-separated with `--from0`); blank lines, and
//!   without `--from0` lines starting with `#` or `;`, are skipped.
//! * A leading `/` is dropped (the name is relative to the source
//!   directory anyway), as are leading `./` and repeated `/`; a trailing
//!   `/` is kept (one `/`: without `-r`, a directory so listed brings
//!   the names in it, as rsync's `--dirs`); a `..` component is refused rather than resolved, and so is a
//!   `.` after the first name (rsync's `-R` marker `a/./b`, which sends
//!   `b` from `a`: not supported).
//! * The names are sorted component by component (a directory before what
//!   is in it) and each is kept once, so that the walk can create the
//!   directories a name implies, once, ahead of it.
//!
//! What the list means for the walk (rsync's `--files-from`, which implies
//! `--relative` and `--dirs`): each name arrives under the same name at the
//! destination, the directories above it are created with their source's
//! metadata, and a listed directory is copied with its contents only with
//! an explicit `-r` (`-a` alone does not recurse).
//!
//! `-R` (rsync's `--relative`) makes the same list of the source operands
//! ([`relative_operands`]): each keeps its path beneath the destination
//! (from after a `/./` marker, else whole), all from one directory, and
//! `-a` recurses as it does anywhere else.

use thiserror::Error;

/// The most names a list may hold (the sender keeps them all).
pub const MAX_LISTED: usize = 1 << 22;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ListError {
    #[error(
        "line {line}: {name:?} has a .. component (names are relative to the source directory)"
    )]
    Parent { line: usize, name: String },
    #[error("line {line}: {name:?} names the source directory itself: list what is in it")]
    Itself { line: usize, name: String },
    #[error(
        "line {line}: {name:?} has a /./ inside (rsync's --relative marker is not supported: list the names relative to the source directory)"
    )]
    Marker { line: usize, name: String },
    #[error("line {line}: a name holds a NUL byte (use --from0 for a NUL-separated list)")]
    Nul { line: usize },
    #[error("line {line}: a name longer than {max} bytes")]
    TooLong { line: usize, max: usize },
    #[error("more than {MAX_LISTED} names")]
    TooMany,
}

/// What is wrong with one name (of a list, or an `-R` operand).
#[derive(Debug, PartialEq, Eq)]
enum BadName {
    Parent,
    Itself,
    Marker,
    Nul,
    TooLong,
}

/// One name relative to its directory, checked: leading `/` and `./` and
/// repeated `/` dropped, one trailing `/` kept, `..` and an inner `.`
/// refused.
fn checked_name(raw: &[u8], max_name: usize) -> Result<Vec<u8>, BadName> {
    if raw.contains(&0) {
        return Err(BadName::Nul);
    }
    let mut parts: Vec<&[u8]> = Vec::new();
    for part in raw.split(|&b| b == b'/') {
        match part {
            b"" => {}
            b"." if parts.is_empty() => {}
            b"." => return Err(BadName::Marker),
            b".." => return Err(BadName::Parent),
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err(BadName::Itself);
    }
    let mut name = parts.join(&b'/');
    if raw.ends_with(b"/") {
        name.push(b'/');
    }
    if name.len() > max_name {
        return Err(BadName::TooLong);
    }
    Ok(name)
}

/// The checked, sorted, deduplicated names of a list's text.
pub fn parse(text: &[u8], from0: bool, max_name: usize) -> Result<Vec<Vec<u8>>, ListError> {
    let separator = if from0 { 0 } else { b'\n' };
    let mut names = Vec::new();
    for (i, raw) in text.split(|&b| b == separator).enumerate() {
        let line = i + 1;
        let raw = if from0 {
            raw
        } else {
            raw.strip_suffix(b"\r").unwrap_or(raw)
        };
        if raw.is_empty() || (!from0 && matches!(raw[0], b'#' | b';')) {
            continue;
        }
        let name = || String::from_utf8_lossy(raw).into_owned();
        names.push(checked_name(raw, max_name).map_err(|bad| match bad {
            BadName::Parent => ListError::Parent { line, name: name() },
            BadName::Itself => ListError::Itself { line, name: name() },
            BadName::Marker => ListError::Marker { line, name: name() },
            BadName::Nul => ListError::Nul { line },
            BadName::TooLong => ListError::TooLong {
                line,
                max: max_name,
            },
        })?);
        if names.len() > MAX_LISTED {
            return Err(ListError::TooMany);
        }
    }
    sort(&mut names);
    Ok(names)
}

/// An `-R` (`--relative`) operand that cannot be sent so.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RelativeError {
    #[error("{0:?}: a .. component cannot be kept in the copy's path (-R)")]
    Parent(String),
    #[error("{0:?} names the directory the path is kept from: name what is in it (-R)")]
    Itself(String),
    #[error("{0:?}: more than one /./ marker (-R keeps the path after the first)")]
    Marker(String),
    #[error("{0:?}: a name longer than {1} bytes")]
    TooLong(String, usize),
    #[error("{0:?}: a path holds a NUL byte")]
    Nul(String),
    #[error(
        "-R: {0:?} and {1:?} keep their paths from different directories (the part before \
         /./); copy them with one rcp each"
    )]
    Bases(String, String),
}

/// `-R` (rsync's `--relative`): an operand's path split into the
/// directory it is sent from and the name kept beneath the destination.
/// The name is what follows the first `/./` (`/home/./ann/notes` sends
/// `ann/notes` from `/home`), else the whole path, from `/` for an
/// absolute one (`/etc/hosts` arrives as `etc/hosts`), else from the
/// working directory (`.`). The name is checked as a `--files-from`
/// name is.
pub fn relative_operand(path: &[u8], max_name: usize) -> Result<(Vec<u8>, Vec<u8>), RelativeError> {
    let shown = || String::from_utf8_lossy(path).into_owned();
    // (`a/.` is `a`, as rsync reads it; `a/./.` names `a` itself.)
    let whole = path.strip_suffix(b"/.").unwrap_or(path);
    if whole.ends_with(b"/.") {
        return Err(RelativeError::Itself(shown()));
    }
    let (base, rest) = match whole.windows(3).position(|w| w == b"/./") {
        Some(i) => (tidy_dir(&whole[..i + 1]), &whole[i + 3..]),
        None if whole.starts_with(b"/") => (b"/".to_vec(), whole),
        None => (b".".to_vec(), whole),
    };
    let name = checked_name(rest, max_name).map_err(|bad| match bad {
        BadName::Parent => RelativeError::Parent(shown()),
        BadName::Itself => RelativeError::Itself(shown()),
        BadName::Nul => RelativeError::Nul(shown()),
        BadName::Marker => RelativeError::Marker(shown()),
        BadName::TooLong => RelativeError::TooLong(shown(), max_name),
    })?;
    Ok((base, name))
}

/// A directory's path without repeated `/`, `.` components or a `/` at
/// its end (`./src//` is `src`), so that two ways of writing one
/// directory compare equal; `/` and `.` where nothing else is left.
fn tidy_dir(dir: &[u8]) -> Vec<u8> {
    let parts: Vec<&[u8]> = dir
        .split(|&b| b == b'/')
        .filter(|p| !p.is_empty() && *p != b".")
        .collect();
    let absolute = dir.starts_with(b"/");
    match (parts.is_empty(), absolute) {
        (true, true) => b"/".to_vec(),
        (true, false) => b".".to_vec(),
        (false, true) => [&b"/"[..], &parts.join(&b'/')].concat(),
        (false, false) => parts.join(&b'/'),
    }
}

/// `-R` for every source operand's path: the one directory they are all
/// sent from, and the name each keeps, in the operands' order ([`sort`]
/// makes them a list).
pub fn relative_operands(
    paths: &[&[u8]],
    max_name: usize,
) -> Result<(Vec<u8>, Vec<Vec<u8>>), RelativeError> {
    let mut base: Option<(Vec<u8>, &[u8])> = None;
    let mut names = Vec::with_capacity(paths.len());
    for &path in paths {
        let (dir, name) = relative_operand(path, max_name)?;
        match &base {
            Some((first, first_path)) if *first != dir => {
                return Err(RelativeError::Bases(
                    String::from_utf8_lossy(first_path).into_owned(),
                    String::from_utf8_lossy(path).into_owned(),
                ));
            }
            Some(_) => {}
            None => base = Some((dir, path)),
        }
        names.push(name);
    }
    let (base, _) = base.expect("a copy has a source");
    Ok((base, names))
}

/// Sorts names component by component (`a`, `a/b`, `a-c`: a directory
/// right before what is in it) and drops repeats (of `a` and `a/`, the
/// second).
pub fn sort(names: &mut Vec<Vec<u8>>) {
    names.sort_by(|a, b| {
        let by_parts = bare(a)
            .split(|&c| c == b'/')
            .cmp(bare(b).split(|&c| c == b'/'));
        by_parts.then(b.len().cmp(&a.len()))
    });
    names.dedup_by(|later, kept| bare(later) == bare(kept));
}

/// `name` without the trailing `/` that asks for a directory's names.
pub fn bare(name: &[u8]) -> &[u8] {
    name.strip_suffix(b"/").unwrap_or(name)
}

/// The directories above `name` (`a`, `a/b` for `a/b/c`), outermost first.
pub fn implied_dirs(name: &[u8]) -> impl Iterator<Item = &[u8]> {
    name.iter()
        .enumerate()
        .filter(|&(_, &c)| c == b'/')
        .map(|(i, _)| &name[..i])
}

/// Whether `name` lies beneath directory `dir`.
pub fn beneath(name: &[u8], dir: &[u8]) -> bool {
    name.len() > dir.len() && name.starts_with(dir) && name[dir.len()] == b'/'
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(text: &str, from0: bool) -> Result<Vec<String>, ListError> {
        parse(text.as_bytes(), from0, 4096).map(|v| {
            v.into_iter()
                .map(|n| String::from_utf8(n).unwrap())
                .collect()
        })
    }

    #[test]
    fn lines_are_read_as_rsync_reads_them() {
        let text = "b/x\n# a comment\n; another\n\n/./a//y/\r\na\nb/x\na-c\n";
        assert_eq!(
            names(text, false).unwrap(),
            ["a", "a/y/", "a-c", "b/x"],
            "sorted by component, repeats dropped, leading / and ./ and CR gone"
        );
        assert_eq!(names("a\na/\na/b\n", false).unwrap(), ["a/", "a/b"]);
        assert_eq!(
            names("#not a comment\0b\0", true).unwrap(),
            ["#not a comment", "b"]
        );
        assert_eq!(
            names("a\nb/../c\n", false).unwrap_err(),
            ListError::Parent {
                line: 2,
                name: "b/../c".into()
            }
        );
        assert!(matches!(
            names("a/./b\n", false),
            Err(ListError::Marker { line: 1, .. })
        ));
        assert!(matches!(
            names("./\n", false),
            Err(ListError::Itself { line: 1, .. })
        ));
        assert!(matches!(
            names("a\0b\n", false),
            Err(ListError::Nul { line: 1 })
        ));
        assert!(matches!(
            parse(b"abcdef", false, 5),
            Err(ListError::TooLong { line: 1, max: 5 })
        ));
    }

    #[test]
    fn relative_operands_keep_the_path_after_the_marker() {
        let split = |p: &str| {
            relative_operand(p.as_bytes(), 4096)
                .map(|(b, n)| (String::from_utf8(b).unwrap(), String::from_utf8(n).unwrap()))
        };
        let pair = |b: &str, n: &str| Ok((b.to_string(), n.to_string()));
        assert_eq!(split("/home/./ann/notes"), pair("/home", "ann/notes"));
        assert_eq!(split("src/./a/b/"), pair("src", "a/b/"));
        assert_eq!(split("/./etc/hosts"), pair("/", "etc/hosts"));
        assert_eq!(split("/etc//hosts"), pair("/", "etc/hosts"));
        assert_eq!(split("a/b"), pair(".", "a/b"));
        assert_eq!(split("./a/b"), pair(".", "a/b"));
        assert!(matches!(split("x/./a/./b"), Err(RelativeError::Marker(_))));
        assert_eq!(split("src/a/."), pair(".", "src/a"));
        assert!(matches!(split("src/./."), Err(RelativeError::Itself(_))));
        assert_eq!(split("./src//./a"), pair("src", "a"));
        assert_eq!(
            split("/x/../y/./a"),
            pair("/x/../y", "a"),
            "before the marker: as given"
        );
        assert_eq!(split("./a"), pair(".", "a"));
        assert!(matches!(split("a/../b"), Err(RelativeError::Parent(_))));
        assert!(matches!(split("../b"), Err(RelativeError::Parent(_))));
        assert!(matches!(split("src/./"), Err(RelativeError::Itself(_))));
        assert!(matches!(split("/"), Err(RelativeError::Itself(_))));
        assert!(matches!(split("."), Err(RelativeError::Itself(_))));

        let both = relative_operands(&[b"/s/./b/x", b"/s/./a"], 4096).unwrap();
        assert_eq!(both, (b"/s".to_vec(), vec![b"b/x".to_vec(), b"a".to_vec()]));
        assert_eq!(
            relative_operands(&[b"/etc/hosts", b"/var/log"], 4096)
                .unwrap()
                .0,
            b"/"
        );
        assert!(matches!(
            relative_operands(&[b"/s/./a", b"/t/./b"], 4096),
            Err(RelativeError::Bases(..))
        ));
        assert_eq!(
            relative_operands(&[b"./src/./a", b"src//./b"], 4096)
                .unwrap()
                .0,
            b"src",
            "one directory written two ways"
        );
        assert!(matches!(
            relative_operands(&[b"/etc/hosts", b"rel"], 4096),
            Err(RelativeError::Bases(..))
        ));
    }

    #[test]
    fn implied_directories_and_what_is_beneath() {
        let dirs: Vec<&[u8]> = implied_dirs(b"a/b/c").collect();
        assert_eq!(dirs, [&b"a"[..], b"a/b"]);
        assert_eq!(implied_dirs(b"top").count(), 0);
        assert!(beneath(b"a/b", b"a"));
        assert!(!beneath(b"a-b", b"a"));
        assert!(!beneath(b"a", b"a"));
        assert!(!beneath(b"ab/c", b"a"));
    }

    proptest! {
        /// Whatever the order of the lines, a directory comes before
        /// everything beneath it, and every name once.
        #[test]
        fn parents_come_first(lines in proptest::collection::vec("[ab-]{1,2}(/[ab-]{1,2}){0,3}", 1..40)) {
            let text = lines.join("\n");
            let got = parse(text.as_bytes(), false, 4096).unwrap();
            for (i, n) in got.iter().enumerate() {
                for later in &got[i + 1..] {
                    prop_assert!(!beneath(n, later), "{n:?} before its directory {later:?}");
                    prop_assert_ne!(n, later);
                }
            }
            let mut want: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
            want.sort();
            want.dedup();
            prop_assert_eq!(got.len(), want.len());
        }
    }
}
