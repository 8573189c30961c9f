//! `--usermap`, `--groupmap` and `--chown`: rsync's owner and group
//! mapping, sans I/O (the names come through [`Names`]).
//!
//! A map is `FROM:TO` pairs separated by commas. The first pair whose
//! FROM matches an id decides; an id no pair matches stays as it is.
//! FROM is:
//! * a number (`1000`) or an inclusive range of numbers (`1000-1999`);
//! * a name (`wayne`), or a wildcard pattern over names (`d*`, `*`: the
//!   filter rules' wildcards, matching the whole name);
//! * empty: the ids that have no name.
//!
//! TO is a name or a number.
//!
//! **Who maps, and whose names.** The rcp the user started maps, and
//! looks names up on its own host: in a push, a local copy or a broadcast
//! the sender maps the entries it sends; in a pull the receiver maps the
//! entries that arrive, before it compares them with what is there.
//! Servers (`rcp serve`, the far side of remote-shell mode) never map:
//! owners cross the wire as numbers and the request carries no map, so
//! the protocol is unchanged. rsync looks FROM names up on the sender and
//! TO names on the receiver; on a cluster whose nodes share their users
//! (one passwd, LDAP, SSSD) the two agree.
//!
//! **As rsync:** with `--numeric-ids` no id has a name (only numbers,
//! ranges, `*` and the empty FROM match, root's id included); `--usermap`
//! implies `-o` and `--groupmap` `-g`; `--chown USER:GROUP` is
//! `--usermap '*:USER' --groupmap '*:GROUP'`, either half may be left
//! out, and it does not mix with the two. Owners are set where the
//! receiver may set them ([`crate::archive::Powers`]).
//!
//! **Unlike rsync**, a TO name this host does not know, a range that runs
//! backwards, a pair without a colon and an unclosed `[` are refused
//! before anything is copied (exit status 2). rsync warns about an
//! unknown TO name and copies without that pair, and takes a backward
//! range as one that matches nothing.

use std::collections::HashMap;
use std::sync::Mutex;

use regex::bytes::Regex;

use crate::proto::Meta;

/// Users or groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Which {
    User,
    Group,
}

impl Which {
    fn option(self) -> &'static str {
        match self {
            Which::User => "--usermap",
            Which::Group => "--groupmap",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Which::User => "user",
            Which::Group => "group",
        }
    }
}

/// Where names and ids are looked up.
pub trait Names: Send + Sync + std::fmt::Debug {
    /// The name of user or group `id`, if it has one.
    fn name(&self, which: Which, id: u32) -> Option<String>;
    /// The id of the user or group called `name`, if there is one.
    fn id(&self, which: Which, name: &str) -> Option<u32>;
}

/// This host's users and groups, through the C library (and so NSS:
/// files, LDAP, SSSD, whatever the host is set up with).
#[derive(Debug, Clone, Copy, Default)]
pub struct System;

impl Names for System {
    fn name(&self, which: Which, id: u32) -> Option<String> {
        use nix::unistd::{Gid, Group, Uid, User};
        match which {
            Which::User => User::from_uid(Uid::from_raw(id)).ok()?.map(|u| u.name),
            Which::Group => Group::from_gid(Gid::from_raw(id)).ok()?.map(|g| g.name),
        }
    }

    fn id(&self, which: Which, name: &str) -> Option<u32> {
        use nix::unistd::{Group, User};
        match which {
            Which::User => User::from_name(name).ok()?.map(|u| u.uid.as_raw()),
            Which::Group => Group::from_name(name).ok()?.map(|g| g.gid.as_raw()),
        }
    }
}

/// A map or `--chown` that cannot be used (bad usage: exit status 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error("{option}: {pair:?} has no colon (each pair is FROM:TO)")]
    NoColon { option: &'static str, pair: String },
    #[error("{option}: {pair:?} maps to nothing (each pair is FROM:TO)")]
    NoTarget { option: &'static str, pair: String },
    #[error("{option}: there is no {noun} called {name:?} on this host")]
    UnknownName {
        option: &'static str,
        noun: &'static str,
        name: String,
    },
    #[error("{option}: {text:?} is not an id (0 to 4294967294)")]
    BadId { option: &'static str, text: String },
    #[error("{option}: the range {range:?} runs backwards")]
    Backwards { option: &'static str, range: String },
    #[error("{option}: {pattern:?} has a [ that is not closed")]
    BadPattern {
        option: &'static str,
        pattern: String,
    },
    #[error("--chown {spec:?} names neither a user nor a group (USER, USER:GROUP or :GROUP)")]
    EmptyChown { spec: String },
}

/// What a pair's FROM matches.
#[derive(Debug)]
enum From {
    /// Ids `lo..=hi`.
    Ids(u32, u32),
    /// The id whose name this is.
    Name(String),
    /// Ids whose name the pattern matches (a nameless id's name is empty).
    Pattern(Regex),
    /// Ids without a name.
    Nameless,
}

#[derive(Debug)]
struct Pair {
    from: From,
    to: u32,
}

/// One `--usermap` or `--groupmap`.
#[derive(Debug)]
pub struct Map {
    pairs: Vec<Pair>,
}

impl Map {
    /// Parses `text`, looking TO names up in `names`.
    pub fn parse(which: Which, text: &str, names: &dyn Names) -> Result<Map, MapError> {
        let option = which.option();
        let pairs = text
            .split(',')
            .map(|pair| {
                let (from, to) = pair.split_once(':').ok_or_else(|| MapError::NoColon {
                    option,
                    pair: pair.into(),
                })?;
                Ok(Pair {
                    from: parse_from(which, from)?,
                    to: parse_to(which, pair, to, names)?,
                })
            })
            .collect::<Result<_, MapError>>()?;
        Ok(Map { pairs })
    }

    /// What `id` becomes; `name` gives its name (`None`: it has none),
    /// asked only when a pair needs it, at most once.
    pub fn map(&self, id: u32, name: impl FnOnce() -> Option<String>) -> u32 {
        let mut name = Some(name);
        let mut looked: Option<Option<String>> = None;
        for pair in &self.pairs {
            let hit = match &pair.from {
                From::Ids(lo, hi) => (*lo..=*hi).contains(&id),
                by_name => {
                    let known = looked.get_or_insert_with(|| name.take().expect("asked once")());
                    match by_name {
                        From::Name(n) => known.as_deref() == Some(n.as_str()),
                        From::Pattern(p) => p.is_match(known.as_deref().unwrap_or("").as_bytes()),
                        _ => known.is_none(),
                    }
                }
            };
            if hit {
                return pair.to;
            }
        }
        id
    }
}

fn parse_from(which: Which, from: &str) -> Result<From, MapError> {
    let option = which.option();
    if from.is_empty() {
        return Ok(From::Nameless);
    }
    if from.contains(['*', '?', '[']) {
        let pattern =
            crate::filter::name_pattern(from.as_bytes()).ok_or_else(|| MapError::BadPattern {
                option,
                pattern: from.into(),
            })?;
        return Ok(From::Pattern(pattern));
    }
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if digits(from) {
        let id = parse_id(which, from)?;
        return Ok(From::Ids(id, id));
    }
    if let Some((lo, hi)) = from.split_once('-').filter(|(l, h)| digits(l) && digits(h)) {
        let (lo, hi) = (parse_id(which, lo)?, parse_id(which, hi)?);
        if lo > hi {
            return Err(MapError::Backwards {
                option,
                range: from.into(),
            });
        }
        return Ok(From::Ids(lo, hi));
    }
    Ok(From::Name(from.into()))
}

fn parse_to(which: Which, pair: &str, to: &str, names: &dyn Names) -> Result<u32, MapError> {
    let option = which.option();
    if to.is_empty() {
        return Err(MapError::NoTarget {
            option,
            pair: pair.into(),
        });
    }
    if to.bytes().all(|b| b.is_ascii_digit()) {
        return parse_id(which, to);
    }
    names.id(which, to).ok_or_else(|| MapError::UnknownName {
        option,
        noun: which.noun(),
        name: to.into(),
    })
}

/// An id as written; the largest u32 is refused: `chown` takes it for
/// "leave as it is".
fn parse_id(which: Which, text: &str) -> Result<u32, MapError> {
    text.parse::<u32>()
        .ok()
        .filter(|&id| id != u32::MAX)
        .ok_or_else(|| MapError::BadId {
            option: which.option(),
            text: text.into(),
        })
}

/// `--chown SPEC` as the `--usermap` and `--groupmap` it stands for.
pub fn chown_maps(spec: &str) -> Result<(Option<String>, Option<String>), MapError> {
    let (user, group) = spec.split_once(':').unwrap_or((spec, ""));
    let all = |to: &str| (!to.is_empty()).then(|| format!("*:{to}"));
    let maps = (all(user), all(group));
    if maps == (None, None) {
        return Err(MapError::EmptyChown { spec: spec.into() });
    }
    Ok(maps)
}

/// The owner and group maps of one copy, applied to the entries' [`Meta`]
/// by the side the user started.
#[derive(Debug)]
pub struct Owners {
    users: Option<Map>,
    groups: Option<Map>,
    /// `--numeric-ids`: no id has a name.
    numeric: bool,
    names: Box<dyn Names>,
    /// Ids mapped already: a tree has few owners, and a lookup may cross
    /// the network (LDAP).
    mapped: Mutex<HashMap<(Which, u32), u32>>,
}

impl Owners {
    /// The maps of `--usermap` and `--groupmap` (`None` where not given),
    /// or `None` when neither is.
    pub fn new(
        users: Option<&str>,
        groups: Option<&str>,
        numeric: bool,
        names: Box<dyn Names>,
    ) -> Result<Option<Owners>, MapError> {
        if users.is_none() && groups.is_none() {
            return Ok(None);
        }
        let parse = |which, text: Option<&str>| {
            text.map(|t| Map::parse(which, t, names.as_ref()))
                .transpose()
        };
        Ok(Some(Owners {
            users: parse(Which::User, users)?,
            groups: parse(Which::Group, groups)?,
            numeric,
            names,
            mapped: Mutex::default(),
        }))
    }

    /// Gives `meta` the mapped owner and group.
    pub fn apply(&self, meta: &mut Meta) {
        if let Some(map) = &self.users {
            meta.uid = self.mapped(Which::User, map, meta.uid);
        }
        if let Some(map) = &self.groups {
            meta.gid = self.mapped(Which::Group, map, meta.gid);
        }
    }

    fn mapped(&self, which: Which, map: &Map, id: u32) -> u32 {
        let mut mapped = self.mapped.lock().unwrap_or_else(|e| e.into_inner());
        *mapped.entry((which, id)).or_insert_with(|| {
            map.map(id, || {
                (!self.numeric)
                    .then(|| self.names.name(which, id))
                    .flatten()
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A host with users root 0, daemon 1, bin 2, wayne 1000, admin 50,
    /// normal 60 (and groups of the same names and ids); it counts the
    /// names asked for.
    #[derive(Debug, Default, Clone)]
    struct Host {
        asked: Arc<AtomicUsize>,
    }

    const TABLE: &[(&str, u32)] = &[
        ("root", 0),
        ("daemon", 1),
        ("bin", 2),
        ("wayne", 1000),
        ("admin", 50),
        ("normal", 60),
    ];

    impl Names for Host {
        fn name(&self, _: Which, id: u32) -> Option<String> {
            self.asked.fetch_add(1, Ordering::Relaxed);
            TABLE
                .iter()
                .find(|(_, i)| *i == id)
                .map(|(n, _)| n.to_string())
        }
        fn id(&self, _: Which, name: &str) -> Option<u32> {
            TABLE.iter().find(|(n, _)| *n == name).map(|(_, i)| *i)
        }
    }

    fn map(text: &str) -> Map {
        Map::parse(Which::User, text, &Host::default()).unwrap()
    }

    fn through(m: &Map, id: u32) -> u32 {
        m.map(id, || Host::default().name(Which::User, id))
    }

    #[test]
    fn the_first_matching_pair_decides_and_the_rest_stay() {
        // rsync's own example.
        let m = map("0-99:60,wayne:admin,*:normal");
        assert_eq!(through(&m, 0), 60);
        assert_eq!(through(&m, 99), 60);
        assert_eq!(through(&m, 1000), 50);
        assert_eq!(through(&m, 4242), 60, "* matches a nameless id too");
        let m = map("1000:2,5-9:1");
        assert_eq!(through(&m, 1000), 2);
        assert_eq!(through(&m, 7), 1);
        assert_eq!(through(&m, 10), 10, "unmatched ids stay");
        assert_eq!(through(&m, 4), 4);
    }

    #[test]
    fn names_patterns_and_the_empty_from() {
        let m = map("d*:bin,:normal,root:admin");
        assert_eq!(through(&m, 1), 2, "daemon matches d*");
        assert_eq!(through(&m, 2), 2, "bin does not");
        assert_eq!(through(&m, 4242), 60, "the empty FROM takes nameless ids");
        assert_eq!(through(&m, 1000), 1000, "named, unmatched");
        assert_eq!(through(&m, 0), 50, "root by name");
        let m = map("wa?ne:1,[ab]*:7");
        assert_eq!(through(&m, 1000), 1);
        assert_eq!(through(&m, 50), 7);
        assert_eq!(through(&m, 2), 7);
        assert_eq!(through(&m, 60), 60);
        // A pattern matches whole names only.
        assert_eq!(through(&map("ay:5,wayn:5"), 1000), 1000);
    }

    #[test]
    fn numeric_ids_leave_every_id_nameless() {
        let owners = Owners::new(
            Some("daemon:bin,:60"),
            Some("*:50"),
            true,
            Box::new(Host::default()),
        )
        .unwrap()
        .unwrap();
        let mut meta = Meta {
            uid: 1,
            gid: 1000,
            ..Meta::default()
        };
        owners.apply(&mut meta);
        assert_eq!((meta.uid, meta.gid), (60, 50));
        let mut root = Meta::default();
        owners.apply(&mut root);
        assert_eq!((root.uid, root.gid), (60, 50), "root is nameless too");
    }

    #[test]
    fn a_name_is_looked_up_once_per_id_and_only_when_a_pair_needs_it() {
        let host = Host::default();
        let m = Map::parse(Which::User, "5-9:1,1000:2", &host).unwrap();
        m.map(7, || host.name(Which::User, 7));
        m.map(3, || host.name(Which::User, 3));
        assert_eq!(host.asked.load(Ordering::Relaxed), 0, "ids only");
        let m = Map::parse(Which::User, "a:1,b:2,c*:3,:4", &host).unwrap();
        assert_eq!(m.map(4242, || host.name(Which::User, 4242)), 4);
        assert_eq!(host.asked.load(Ordering::Relaxed), 1);

        let host = Host::default();
        let owners = Owners::new(Some("wayne:2"), None, false, Box::new(host.clone()));
        let owners = owners.unwrap().unwrap();
        for _ in 0..3 {
            let mut meta = Meta {
                uid: 1000,
                gid: 9,
                ..Meta::default()
            };
            owners.apply(&mut meta);
            assert_eq!(
                (meta.uid, meta.gid),
                (2, 9),
                "no group map: the group stays"
            );
        }
        assert_eq!(host.asked.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn bad_maps_say_what_is_wrong() {
        let err = |text: &str| Map::parse(Which::Group, text, &Host::default()).unwrap_err();
        assert!(matches!(err("abc"), MapError::NoColon { .. }));
        assert!(matches!(err("1:2,abc"), MapError::NoColon { .. }));
        assert!(matches!(err("1:"), MapError::NoTarget { .. }));
        assert!(matches!(err("*:nosuch"), MapError::UnknownName { .. }));
        assert!(matches!(err("9-5:1"), MapError::Backwards { .. }));
        assert!(matches!(err("4294967296:1"), MapError::BadId { .. }));
        assert!(matches!(err("1:4294967295"), MapError::BadId { .. }));
        assert!(matches!(err("[ab:1"), MapError::BadPattern { .. }));
        let shown = err("*:nosuch").to_string();
        assert!(
            shown.contains("--groupmap") && shown.contains("no group called \"nosuch\""),
            "{shown}"
        );
        // A name that is not a range stays a name (it may exist elsewhere).
        assert_eq!(through(&map("5-x:1"), 5), 5);
    }

    #[test]
    fn chown_stands_for_two_catch_all_maps() {
        let maps = |s: &str| chown_maps(s).unwrap();
        assert_eq!(
            maps("bin:daemon"),
            (Some("*:bin".into()), Some("*:daemon".into()))
        );
        assert_eq!(maps("bin"), (Some("*:bin".into()), None));
        assert_eq!(maps("bin:"), (Some("*:bin".into()), None));
        assert_eq!(maps(":daemon"), (None, Some("*:daemon".into())));
        assert!(matches!(chown_maps(":"), Err(MapError::EmptyChown { .. })));
        assert!(matches!(chown_maps(""), Err(MapError::EmptyChown { .. })));
    }
}
