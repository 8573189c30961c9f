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
    SkipUnsafe,
}

/// Whether a symlink at entry path `path` (the operand's name first)
/// whose target is `target` leads outside the copied tree, by rsync's
/// rule, read from the text and never resolved: an absolute or empty
/// target does, and so does one whose `..` climb above the operand (the
/// top of the tree: a link at `top/a/l` may climb one level, to `top`).
/// A link that is the operand itself stays where it is named.
pub fn leads_outside(path: &[u8], target: &[u8]) -> bool {
    if target.first().is_none_or(|&b| b == b'/') {
        return true;
    }
    // Directories between the top and the link.
    let mut depth = path.split(|&b| b == b'/').count().saturating_sub(2) as i64;
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
        let outside = |path: &str, target: &str| leads_outside(path.as_bytes(), target.as_bytes());
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
    }
}
