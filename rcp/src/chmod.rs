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
//!   `g`, `o` or `a`, the bits of the user's umask are left alone (chmod's
//!   rule: the client's umask, sent with the rules). `X` is `x` for a
//!   directory, or for what has some `x` already;
//! - either prefixed with `D` (only directories) or `F` (only what is not
//!   a directory).

use std::fmt;

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
    /// `who` (bits that may change), an operator, the letters' bits.
    Symbolic { who: u32, op: Op, perms: Perms },
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
    /// `r`, `w`, `x`, `s`, `t` as the bits they stand for, for all.
    bits: u32,
    /// `X`.
    cond_x: bool,
}

/// A rule that is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadChmod(pub String);

impl fmt::Display for BadChmod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--chmod {:?}: not a rule (as 644, go-w, u=rwX, Dg+s, Fa-x)",
            self.0
        )
    }
}

impl std::error::Error for BadChmod {}

impl Chmod {
    /// `text` (comma-separated rules) read under `umask`.
    pub fn parse(text: &str, umask: u32) -> Result<Chmod, BadChmod> {
        let bad = |rule: &str| BadChmod(rule.to_string());
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
            let mut who = 0;
            for c in who_text.chars() {
                who |= match c {
                    'u' => 0o4700,
                    'g' => 0o2070,
                    'o' => 0o1007,
                    'a' => 0o7777,
                    _ => return Err(bad(rule)),
                };
            }
            if who == 0 {
                // (chmod's: the umask's bits stay as they are.)
                who = 0o7777 & !(umask & 0o777);
            }
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
                    's' => perms.bits |= 0o6000,
                    't' => perms.bits |= 0o1000,
                    // (One operator a rule, as rsync takes them.)
                    _ => return Err(bad(rule)),
                }
            }
            rules.push(Rule {
                only,
                how: How::Symbolic { who, op, perms },
            });
        }
        Ok(Chmod { rules })
    }

    /// `mode` (type bits and all) of a directory or not, with the rules
    /// applied in turn; the type bits stay.
    pub fn apply(&self, mode: u32, is_dir: bool) -> u32 {
        let mut perm = mode & 0o7777;
        for rule in &self.rules {
            match rule.only {
                Only::Dirs if !is_dir => continue,
                Only::Files if is_dir => continue,
                _ => {}
            }
            perm = match rule.how {
                How::Octal(n) => n,
                How::Symbolic { who, op, perms } => {
                    let mut bits = perms.bits;
                    if perms.cond_x && (is_dir || perm & 0o111 != 0) {
                        bits |= 0o111;
                    }
                    let bits = bits & who;
                    match op {
                        Op::Add => perm | bits,
                        Op::Remove => perm & !bits,
                        // (`=` clears what `who` names, the umask's bits
                        // aside, and sets the letters.)
                        Op::Set => (perm & !who) | bits,
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

    #[test]
    fn what_is_not_a_rule_is_refused() {
        for bad in [
            "", "u-w+x", "q+r", "u+z", "D", "8", "17777", "u", ",", "Fu+r,",
        ] {
            assert!(Chmod::parse(bad, 0o022).is_err(), "{bad:?}");
        }
    }
}
