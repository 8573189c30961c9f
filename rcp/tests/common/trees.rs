//! Generated trees with every kind of thing archive mode keeps, and the
//! entry-by-entry comparison of two trees that rsync's result is the
//! oracle of (archive and re-sync tests alike).

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use test_support::pattern;

pub const CHUNK: usize = 64 * 1024;

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// `system.posix_acl_*` in the kernel's format: version 2, then (tag,
/// permissions, id) entries sorted by tag and id.
pub fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}
pub const ANY: u32 = u32::MAX;

pub fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty())
        .unwrap_or_else(|e| panic!("setxattr {name} on {}: {e}", path.display()));
}

pub fn set_times(path: &Path, sec: i64, nsec: i64) {
    let t = rustix::fs::Timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &rustix::fs::Timestamps {
            last_access: t,
            last_modification: t,
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

/// What a generated tree holds, to show the comparison is not vacuous.
#[derive(Debug, Default)]
pub struct Made {
    pub files: usize,
    pub link_groups: usize,
    pub xattrs: usize,
    pub acls: usize,
    pub specials: usize,
    pub devices: usize,
    pub owned: usize,
}

/// A tree with every kind of thing archive mode keeps, from `seed`.
pub fn generate(root: &Path, seed: u64) -> Made {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut made = Made::default();
    let root_user = is_root();
    std::fs::create_dir_all(root).unwrap();
    let names: [&[u8]; 8] = [
        b"plain",
        b"with space",
        "ünï cödé".as_bytes(),
        b"bytes\xff\xfe",
        b"-dash",
        b"new\nline",
        b".hidden",
        b"x",
    ];
    let mut dirs = vec![root.to_path_buf()];
    let mut all: Vec<PathBuf> = Vec::new();
    let mut files: Vec<PathBuf> = Vec::new();
    for i in 0..60 {
        let parent = dirs[rng.random_range(0..dirs.len())].clone();
        let mut name = names[rng.random_range(0..names.len())].to_vec();
        name.extend_from_slice(format!("-{i}").as_bytes());
        let p = parent.join(OsStr::from_bytes(&name));
        match rng.random_range(0..10) {
            0..=1 if parent.components().count() < root.components().count() + 4 => {
                std::fs::create_dir(&p).unwrap();
                dirs.push(p.clone());
            }
            2 => {
                let target = if rng.random_bool(0.5) {
                    "plain-0"
                } else {
                    "../nowhere"
                };
                std::os::unix::fs::symlink(target, &p).unwrap();
            }
            3 => {
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    &p,
                    rustix::fs::FileType::Fifo,
                    rustix::fs::Mode::from_raw_mode(0o640),
                    0,
                )
                .unwrap();
                made.specials += 1;
            }
            4 if root_user => {
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    &p,
                    rustix::fs::FileType::CharacterDevice,
                    rustix::fs::Mode::from_raw_mode(0o600),
                    rustix::fs::makedev(1, 3 + rng.random_range(0..3)),
                )
                .unwrap();
                made.devices += 1;
            }
            5 => {
                let l = std::os::unix::net::UnixListener::bind(&p).unwrap();
                drop(l);
                made.specials += 1;
            }
            _ => {
                // Sizes around the chunk, and sparse shapes whose one data
                // chunk is not the first.
                let size =
                    [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5][rng.random_range(0..6)];
                let f = std::fs::File::create(&p).unwrap();
                if rng.random_bool(0.2) {
                    f.set_len(5 * CHUNK as u64).unwrap();
                    std::os::unix::fs::FileExt::write_all_at(
                        &f,
                        &pattern(100, i),
                        3 * CHUNK as u64 + 7,
                    )
                    .unwrap();
                } else {
                    std::os::unix::fs::FileExt::write_all_at(&f, &pattern(size, i), 0).unwrap();
                }
                files.push(p.clone());
                made.files += 1;
            }
        }
        all.push(p);
    }
    // Hard-link groups, across directories.
    for g in 0..4 {
        let first = files[rng.random_range(0..files.len())].clone();
        if std::fs::metadata(&first).unwrap().nlink() > 1 {
            continue;
        }
        for k in 0..rng.random_range(1..3) {
            let dir = &dirs[rng.random_range(0..dirs.len())];
            let p = dir.join(format!("link-{g}-{k}"));
            std::fs::hard_link(&first, &p).unwrap();
            all.push(p);
        }
        made.link_groups += 1;
    }
    // Metadata on everything: xattrs, ACLs, owners, modes.
    for p in all.iter().chain(dirs.iter().skip(1)) {
        let meta = std::fs::symlink_metadata(p).unwrap();
        let ft = meta.file_type();
        // user.* attributes and ACLs live on files and directories only.
        let plain = ft.is_file() || ft.is_dir();
        if plain && rng.random_bool(0.4) {
            let len = rng.random_range(0..1500);
            set_xattr(p, "user.note", &pattern(len, 9));
            set_xattr(p, "user.empty", b"");
            made.xattrs += 1;
            if root_user {
                set_xattr(p, "trusted.rcp", b"root only");
            }
        }
        if plain && rng.random_bool(0.3) {
            set_xattr(
                p,
                "system.posix_acl_access",
                &acl(&[
                    (1, 6, ANY),
                    (2, 4, 1234),
                    (4, 4, ANY),
                    (0x10, 6, ANY),
                    (0x20, 0, ANY),
                ]),
            );
            made.acls += 1;
        }
        if ft.is_dir() && rng.random_bool(0.3) {
            set_xattr(
                p,
                "system.posix_acl_default",
                &acl(&[
                    (1, 7, ANY),
                    (4, 5, ANY),
                    (8, 5, 4321),
                    (0x10, 7, ANY),
                    (0x20, 5, ANY),
                ]),
            );
            made.acls += 1;
        }
        if root_user && rng.random_bool(0.5) {
            let (uid, gid) = (rng.random_range(1000..1100), rng.random_range(1000..1100));
            std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
            made.owned += 1;
        }
        if !ft.is_symlink() {
            let mode = [0o644, 0o600, 0o755, 0o4755, 0o2750, 0o444, 0o1777][rng.random_range(0..7)];
            let mode = if ft.is_dir() { mode | 0o700 } else { mode };
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
    }
    // Times last, deepest first; in the past, with nanoseconds (rsync
    // leaves a time alone that matches the current second).
    let mut everything: Vec<&PathBuf> = all.iter().chain(dirs.iter()).collect();
    everything.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in everything {
        set_times(
            p,
            1_500_000_000 + rng.random_range(0..100_000_000),
            rng.random_range(0..1_000_000_000),
        );
    }
    made
}

/// Everything archive mode keeps about one entry.
#[derive(Debug, PartialEq, Eq)]
pub struct Seen {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: (i64, i64),
    pub rdev: u64,
    /// Contents of a file, target of a symlink.
    pub data: Vec<u8>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

pub fn xattrs_of(p: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut list = vec![0u8; 65536];
    let n = rustix::fs::llistxattr(p, &mut list[..]).unwrap();
    let mut out = BTreeMap::new();
    // (XFS lists its ACLs to root a second time, under their on-disk
    // names: they are compared as the system.posix_acl_* they are. Spelled
    // out here, not taken from rcp's archive::acl_alias: the oracle does
    // not lean on the code it checks.)
    let alias = |n: &[u8]| n == b"trusted.SGI_ACL_FILE" || n == b"trusted.SGI_ACL_DEFAULT";
    for name in list[..n]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty() && !alias(n))
    {
        let mut v = vec![0u8; 65536];
        let c = CString::new(name).unwrap();
        let len = rustix::fs::lgetxattr(p, c.as_c_str(), &mut v[..]).unwrap();
        out.insert(name.to_vec(), v[..len].to_vec());
    }
    out
}

/// Relative paths, as bytes.
pub type Rel = Vec<u8>;

/// Every entry beneath `root` by relative path, and its hard-link groups.
pub fn look(root: &Path) -> (BTreeMap<Rel, Seen>, Vec<Vec<Rel>>) {
    let mut seen = BTreeMap::new();
    let mut inodes: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p
                .strip_prefix(root)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec();
            let data = if m.is_file() {
                std::fs::read(&p).unwrap()
            } else if m.file_type().is_symlink() {
                std::fs::read_link(&p)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec()
            } else {
                vec![]
            };
            if m.is_dir() {
                stack.push(p.clone());
            } else if m.nlink() > 1 {
                inodes.entry(m.ino()).or_default().push(rel.clone());
            }
            seen.insert(
                rel,
                Seen {
                    mode: m.mode(),
                    uid: m.uid(),
                    gid: m.gid(),
                    mtime: (m.mtime(), m.mtime_nsec()),
                    rdev: m.rdev(),
                    data,
                    xattrs: xattrs_of(&p),
                },
            );
        }
    }
    let mut groups: Vec<_> = inodes
        .into_values()
        .map(|mut g| {
            g.sort();
            g
        })
        .collect();
    groups.sort();
    (seen, groups)
}

/// Differences between two trees, one line each.
pub fn differences(a: &Path, b: &Path) -> Vec<String> {
    let ((sa, ga), (sb, gb)) = (look(a), look(b));
    let mut out = Vec::new();
    for (path, x) in &sa {
        let shown = String::from_utf8_lossy(path);
        match sb.get(path) {
            None => out.push(format!("{shown}: only in {}", a.display())),
            Some(y) if x != y => out.push(format!("{shown}: {x:?} != {y:?}")),
            _ => {}
        }
    }
    for path in sb.keys().filter(|p| !sa.contains_key(*p)) {
        out.push(format!(
            "{}: only in {}",
            String::from_utf8_lossy(path),
            b.display()
        ));
    }
    if ga != gb {
        out.push(format!("hard-link groups differ: {ga:?} != {gb:?}"));
    }
    out
}

/// Fails with every difference between the trees, one a line.
pub fn assert_same(what: &str, a: &Path, b: &Path) {
    let diff = differences(a, b);
    assert!(
        diff.is_empty(),
        "{what}: {} differences:\n{}",
        diff.len(),
        diff.join("\n")
    );
}

pub fn run(cmd: &mut Command) {
    let out = cmd.output().expect("runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

pub fn rsync_available() -> bool {
    Command::new("rsync").arg("--version").output().is_ok()
}

/// rsync's result for `src`: the oracle.
pub fn rsync_copy(src: &Path, dst: &Path) {
    run(Command::new("rsync")
        .arg("-aHAX")
        .arg(format!("{}/", src.display()))
        .arg(format!("{}/", dst.display())));
}
