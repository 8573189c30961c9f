//! A source the user names that is not there (an operand, a name in a
//! `--files-from` list) fails alone, as rsync's: the other sources are
//! copied, the copy ends with status 1 (rsync's 23) naming it, and
//! `--delete` deletes nothing (a copy that failed deletes nothing, where
//! rsync 3.5 deletes all the same). With `--ignore-missing-args` it is passed
//! over without a word and the copy succeeds. In every mode, beside
//! rsync's own result. (Before, rcp stopped the whole copy at it, exit 5.)

use std::ffi::OsStr;
use std::path::Path;

use test_support::Scratch;

mod common;
use common::modes::{EVERY_MODE, Modes, rsync_sources_out};
use common::trees::{assert_same, set_times};

fn write(p: &Path, data: &[u8]) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
    set_times(p, 1_600_000_000, 0);
    set_times(p.parent().unwrap(), 1_600_000_000, 0);
}

#[test]
fn a_missing_source_fails_alone_and_ignore_missing_args_passes_it_over() {
    let t = Scratch::new("missing-sources");
    write(&t.path("src/tree/f"), b"there");
    let (missing, there) = (t.path("src/gone"), t.path("src/tree"));
    // (One whose directory is not there either.)
    let below = t.path("src/nodir/x");
    let modes = Modes::new(&t, &[]);
    // What a destination holds from before, which --delete would remove.
    let before = |into: &Path| write(&into.join("tree/extra"), b"from before");
    // (rsync without --delete: what rcp's copy that failed leaves.)
    let oracle = t.path("rsync");
    before(&oracle);
    let out = rsync_sources_out(
        &["-a"].map(OsStr::new),
        &[&missing, &below, &there],
        &oracle,
    );
    assert_eq!(out.status.code(), Some(23), "rsync: {out:?}");
    for mode in EVERY_MODE {
        let tag = mode.replace(' ', "-");
        let into = t.path(&format!("named-{tag}"));
        before(&into);
        let args = ["-a", "--delete"].map(OsStr::new).to_vec();
        let out = modes.run_sources_out(mode, args, &[&missing, &below, &there], &into);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{mode}: {err}");
        assert!(
            err.contains("gone") && err.contains("No such file"),
            "{mode}: {err}"
        );
        // The rest arrived; nothing was deleted.
        assert_same(mode, &oracle, &into);
        assert!(into.join("tree/extra").exists(), "{mode}");

        let into = t.path(&format!("ignored-{tag}"));
        std::fs::create_dir(&into).unwrap();
        let args = ["-a", "--ignore-missing-args"].map(OsStr::new).to_vec();
        let out = modes.run_sources_out(mode, args, &[&missing, &below, &there], &into);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode}: {err}");
        assert!(!err.contains("gone"), "{mode}: {err}");
        assert_eq!(std::fs::read(into.join("tree/f")).unwrap(), b"there");
    }
}

/// A name in a `--files-from` list that is not there: the same.
#[test]
fn a_missing_listed_name_fails_alone() {
    let t = Scratch::new("missing-listed");
    write(&t.path("src/a"), b"listed and there");
    std::fs::write(t.path("list"), "a\ngone\nnodir/x\n").unwrap();
    let modes = Modes::new(&t, &[]);
    let list = t.path("list");
    for (ignore, status) in [(false, 1), (true, 0)] {
        let into = t.path(&format!("listed-{ignore}"));
        let mut args: Vec<&OsStr> = ["-a", "--files-from"].map(OsStr::new).to_vec();
        args.push(list.as_os_str());
        if ignore {
            args.push(OsStr::new("--ignore-missing-args"));
        }
        let out = modes.run_out("local", args, &t.path("src"), &into);
        assert_eq!(out.status.code(), Some(status), "{out:?}");
        assert_eq!(std::fs::read(into.join("a")).unwrap(), b"listed and there");
        // (What a name not there implies is not made either.)
        assert!(!into.join("nodir").exists(), "{ignore}");
    }
}
