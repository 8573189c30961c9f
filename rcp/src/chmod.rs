//! `--chmod`, as rsync's: the permissions the sender reports for what it
//! sends, changed as `chmod(1)` would change them, before the receiver
//! applies them (with `-p`) or masks them for a new file (without). The
//! sender's walk applies them, so every mode sees the same (a pull's
//! sender is told them in the request's `Extras`). **Sans I/O.**
//!
//! The rules, comma-separated, each applied in turn:
//!
//! - an octal mode (`644`): the permission bits become it;
//! - `[ugoa]*[+-=][rwxXst]*` (`go-w`, `u=rwX`, `a+X`, `+x`): chmod's
//!   symbolic form, one operator a rule as rsync takes it. Without `u`,
//!   `g`, `o` or `a`, the letters leave the bits of the user's umask
//!   alone (chmod's rule: the client's umask, sent with the rules). `X`
//!   is `x` for a directory, or for what had some `x` before any rule.
//!   `=` clears the `rwx` bits of whom it names (all, naming no one) and
//!   never the setuid, setgid and sticky bits. `s` is setgid for `g`,
//!   setuid for `u`, and setuid too where `g` is not named; `t` is the
//!   sticky bit whomever it names. (rsync 3.5's results, which the tests
//!   hold;)
//! - either prefixed with `D` (only directories) or `F` (only what is not
//!   a directory).

/// The rules, parsed, with the umask they were given under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chmod {
    rules: Vec<Rule>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rule {
    only: Only,
    how: How,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Only {
    All,
    Dirs,
    Files,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// The permission bits become these.
    Octal(u32),
    /// The `rwx` bits the letters may touch (`who`), those `=` clears,
    /// an operator, the letters.
    Symbolic {
        who: u32,
        clears: u32,
        op: Op,
        perms: Perms,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Remove,
    Set,
}

/// The letters of a symbolic rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Perms {
    /// `r`, `w`, `x` as the bits they stand for, for all.
    bits: u32,
    /// `X`.
    cond_x: bool,
    /// `s` and `t`, as the bits they set for whom the rule names.
    special: u32,
}

/// Rules that cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadChmod {
    #[error("--chmod {0:?}: not a rule (as 644, go-w, u=rwX, Dg+s, Fa-x)")]
    NotARule(String),
    #[error("--chmod: {0} bytes of rules, more than the {1} a request carries")]
    TooLong(usize, usize),
}

impl Chmod {
    /// `text` (comma-separated rules) read under `umask`.
    pub fn parse(text: &str, umask: u32) -> Result<Chmod, BadChmod> {
        let bad = |rule: &str| BadChmod::NotARule(rule.to_string());
        let mut rules = Vec::new();
        for rule in text.split(',') {
            let (only, rest) = match rule.as_bytes().first() {
                Some(b'D') => (Only::Dirs, &rule[1..]),
                Some(b'F') => (Only::Files, &rule[1..]),
                _ => (Only::All, rule),
            };
            if rest.is_empty() {
                return Err(bad(rule));
            }
            if rest.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
                let n = u32::from_str_radix(rest, 8).map_err(|_| bad(rule))?;
                if n > 0o7777 {
                    return Err(bad(rule));
                }
                rules.push(Rule {
                    only,
                    how: How::Octal(n),
                });
                continue;
            }
            let at = rest.find(['+', '-', '=']).ok_or_else(|| bad(rule))?;
            let (who_text, rest) = rest.split_at(at);
            let (mut named, mut user, mut group) = (0, false, false);
            for c in who_text.chars() {
                named |= match c {
                    'u' => 0o700,
                    'g' => 0o070,
                    'o' => 0o007,
                    'a' => 0o777,
                    _ => return Err(bad(rule)),
                };
                user |= matches!(c, 'u' | 'a');
                group |= matches!(c, 'g' | 'a');
            }
            // (Naming no one: all, the umask's bits aside, chmod's way;
            // `=` clears all the same.)
            let (who, clears) = match named {
                0 => (0o777 & !(umask & 0o777), 0o777),
                n => (n, n),
            };
            let op = match rest.as_bytes()[0] {
                b'+' => Op::Add,
                b'-' => Op::Remove,
                _ => Op::Set,
            };
            let mut perms = Perms::default();
            for c in rest[1..].chars() {
                match c {
                    'r' => perms.bits |= 0o444,
                    'w' => perms.bits |= 0o222,
                    'x' => perms.bits |= 0o111,
                    'X' => perms.cond_x = true,
                    's' => {
                        if group {
                            perms.special |= 0o2000;
                        }
                        if user || !group {
                            perms.special |= 0o4000;
                        }
                    }
                    't' => perms.special |= 0o1000,
                    // (One operator a rule, as rsync takes them.)
                    _ => return Err(bad(rule)),
                }
            }
            rules.push(Rule {
                only,
                how: How::Symbolic {
                    who,
                    clears,
                    op,
                    perms,
                },
            });
        }
        Ok(Chmod { rules })
    }

    /// `mode` (type bits and all) of a directory or not, with the rules
    /// applied in turn; the type bits stay.
    pub fn apply(&self, mode: u32, is_dir: bool) -> u32 {
        let mut perm = mode & 0o7777;
        // (`X` looks at the mode before any rule, as rsync's does.)
        let had_x = is_dir || mode & 0o111 != 0;
        for rule in &self.rules {
            match rule.only {
                Only::Dirs if !is_dir => continue,
                Only::Files if is_dir => continue,
                _ => {}
            }
            perm = match rule.how {
                How::Octal(n) => n,
                How::Symbolic {
                    who,
                    clears,
                    op,
                    perms,
                } => {
                    let mut bits = perms.bits;
                    if perms.cond_x && had_x {
                        bits |= 0o111;
                    }
                    let bits = (bits & who) | perms.special;
                    match op {
                        Op::Add => perm | bits,
                        Op::Remove => perm & !bits,
                        Op::Set => (perm & !clears) | bits,
                    }
                }
            };
        }
        (mode & !0o7777) | perm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each rule against what rsync 3.5 made of it (with `-p`, umask 022)
    /// for a file of mode 644, a file of mode 700 and a directory of mode
    /// 755.
    #[test]
    fn rules_change_modes_as_rsyncs_do() {
        for (text, f, x, d) in [
            ("+w", 0o644, 0o700, 0o755),
            ("Fgo-r", 0o600, 0o700, 0o755),
            ("D700,F600", 0o600, 0o600, 0o700),
            ("u=rwX,go=rX", 0o644, 0o755, 0o755),
            ("a+X", 0o644, 0o711, 0o755),
            ("g+s", 0o2644, 0o2700, 0o2755),
            ("o=", 0o640, 0o700, 0o750),
            ("Dg+s,Fu+x", 0o744, 0o700, 0o2755),
            ("644", 0o644, 0o644, 0o644),
            ("ug+rw,o-rwx", 0o660, 0o760, 0o770),
            ("u+x,g-r", 0o704, 0o700, 0o715),
            ("=r", 0o444, 0o444, 0o444),
            ("a=rw,u+x", 0o766, 0o766, 0o766),
            ("Da+t", 0o644, 0o700, 0o1755),
            ("+X", 0o644, 0o711, 0o755),
            // (The file 644's X: before any rule, so `u+x` gives it none.)
            ("u+x,go+X", 0o744, 0o711, 0o755),
            ("=rw", 0o644, 0o644, 0o644),
            ("+s", 0o4644, 0o4700, 0o4755),
            ("o+s", 0o4644, 0o4700, 0o4755),
            ("a+s", 0o6644, 0o6700, 0o6755),
            ("u+t", 0o1644, 0o1700, 0o1755),
            ("o=t", 0o1640, 0o1700, 0o1750),
            ("=X", 0o000, 0o111, 0o111),
        ] {
            let c = Chmod::parse(text, 0o022).unwrap();
            let got = (
                c.apply(0o100644, false),
                c.apply(0o100700, false),
                c.apply(0o040755, true),
            );
            let want = (0o100000 | f, 0o100000 | x, 0o040000 | d);
            assert_eq!(got, want, "{text}: {:o} {:o} {:o}", got.0, got.1, got.2);
        }
    }

    /// `=` keeps the setuid, setgid and sticky bits (a shared directory
    /// keeps its setgid), as rsync's does.
    #[test]
    fn set_clears_only_the_rwx_bits_it_names() {
        let c = |text| Chmod::parse(text, 0o022).unwrap();
        assert_eq!(c("Dg=rwx").apply(0o042755, true), 0o042775);
        assert_eq!(c("a=rwX").apply(0o042755, true), 0o042777);
        assert_eq!(c("=").apply(0o104755, false), 0o104000);
        assert_eq!(c("u=rwx,g=s").apply(0o100666, false), 0o102706);
        assert_eq!(
            c("=rw").apply(0o100666, false),
            0o100644,
            "the umask's w stays off"
        );
    }

    #[test]
    fn what_is_not_a_rule_is_refused() {
        for bad in [
            "", "u-w+x", "q+r", "u+z", "D", "8", "17777", "u", ",", "Fu+r,",
        ] {
            assert!(Chmod::parse(bad, 0o022).is_err(), "{bad:?}");
        }
    }
}
