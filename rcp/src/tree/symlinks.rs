//! What a walk does with symlinks (`-L`, `--copy-unsafe-links`,
//! `--safe-links`), and rsync's rule for a symlink that leads outside the
//! copied tree. **Sans I/O**: [`Walker`](super::Walker) follows them.

/// What a walk does with a symlink: rsync's `-l` (the default here),
/// `-L`, `--copy-unsafe-links` and `--safe-links`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symlinks {
    /// Sent as a symlink.
    Keep,
    /// `-L`: what it points to is sent in its place, under its name (a
    /// file, a directory and what is in it, a special file).
    Follow,
    /// `--copy-unsafe-links`: followed where it leads outside the copied
    /// tree ([`leads_outside`]), kept where it stays inside.
    FollowUnsafe,
    /// `--safe-links`: left out where it leads outside the copied tree.
    /// As rsync's, on the receiving side: the sender sends it as a
    /// symlink, the receiver makes nothing of it and keeps its name
    /// (`--delete` leaves what is there).
    SkipUnsafe,
}

/// Whether a symlink at entry path `path` whose target is `target` leads
/// outside the copied tree, by rsync's rule, read from the text and never
/// resolved: an absolute or empty target does, and so does one whose `..`
/// climb above the tree's top. `under_top`: the path starts with the name
/// of the directory copied, the top (an operand's walk: a link at
/// `top/a/l` may climb one level, to `top`; a link that is the operand
/// itself stays where it is named); else it is relative to the top (a
/// `--files-from` walk: `a/l` may climb one level).
pub fn leads_outside(path: &[u8], target: &[u8], under_top: bool) -> bool {
    if target.first().is_none_or(|&b| b == b'/') {
        return true;
    }
    // Directories between the top and the link.
    let mut depth = path
        .split(|&b| b == b'/')
        .count()
        .saturating_sub(1 + usize::from(under_top)) as i64;
    for part in target.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            _ => depth += 1,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rsync's rule (`unsafe_symlink`), with the copied directory as the
    /// top: what its `..` may climb to, from where the link is.
    #[test]
    fn a_symlink_leads_outside_by_rsyncs_rule() {
        let outside =
            |path: &str, target: &str| leads_outside(path.as_bytes(), target.as_bytes(), true);
        // Absolute or empty: always.
        assert!(outside("top/a", "/etc/passwd"));
        assert!(outside("top/a/b", "/top/a"));
        assert!(outside("top/a", ""));
        // Down or sideways inside: never.
        assert!(!outside("top/a", "b"));
        assert!(!outside("top/a", "./b/../c"));
        assert!(!outside("top/d/a", "../b"));
        assert!(!outside("top/d/e/a", "../../b"));
        // Climbing above the top, even to come back in.
        assert!(outside("top/a", "../b"));
        assert!(outside("top/d/a", "../../top/b"));
        assert!(outside("top/d/a", "x/../../../b"));
        // Down first, then up: as deep as it went.
        assert!(!outside("top/a", "d/e/../../b"));
        // The operand itself: where it is named.
        assert!(!outside("link", "b"));
        assert!(outside("link", "../b"));
        // A `--files-from` walk's paths start below the top.
        let listed =
            |path: &str, target: &str| leads_outside(path.as_bytes(), target.as_bytes(), false);
        assert!(!listed("a/l", "../x"));
        assert!(listed("a/l", "../../x"));
        assert!(listed("l", "../x"));
    }
}
