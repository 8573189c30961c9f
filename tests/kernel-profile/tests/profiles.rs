//! The launcher, run for real: each profile's filter is installed over a
//! probe (the binary's hidden `--probe`), and what the kernel answered is
//! compared with what the profile promises and with what the unfiltered
//! host answers.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};

const LAUNCHER: &str = env!("CARGO_BIN_EXE_kernel-profile");
const SIGSYS: i32 = 31;

/// Runs the probe for `tokens`, under `profile` or (None) unfiltered, and
/// returns the answer for each token ("ok", "ENOSYS", "EINVAL", ...).
fn probe(profile: Option<&str>, tokens: &[&str]) -> HashMap<String, String> {
    let mut command = Command::new(LAUNCHER);
    if let Some(profile) = profile {
        command.args([profile, "--", LAUNCHER]);
    }
    let output = command.arg("--probe").args(tokens).output().expect("runs");
    answers(&output, tokens.len())
}

fn answers(output: &Output, expected_lines: usize) -> HashMap<String, String> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let answers: HashMap<String, String> = stdout
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let token = fields.next()?;
            let _name = fields.next()?;
            Some((token.to_owned(), fields.next()?.to_owned()))
        })
        .collect();
    assert_eq!(answers.len(), expected_lines, "{stdout}");
    answers
}

fn answer<'a>(answers: &'a HashMap<String, String>, token: &str) -> &'a str {
    answers
        .get(token)
        .unwrap_or_else(|| panic!("no answer for {token}: {answers:?}"))
}

#[test]
fn rhel8_refuses_every_call_after_4_18() {
    let tokens = [
        "425", "426", "427", "451", "435", "434", "436", "437", "439", "441", "424", "39", "0", "1",
    ];
    let host = probe(None, &tokens);
    let rhel8 = probe(Some("rhel8"), &tokens);
    for refused in &tokens[..11] {
        assert_eq!(answer(&rhel8, refused), "ENOSYS", "{refused}");
    }
    // The filter said it, not the host: here these calls exist.
    for exists in ["425", "451", "435"] {
        assert_ne!(answer(&host, exists), "ENOSYS", "{exists} on the host");
    }
    for works in ["39", "0", "1"] {
        assert_eq!(answer(&rhel8, works), "ok", "{works}");
    }
}

#[test]
fn rhel8_threads_still_start_and_inherit_the_filter() {
    // glibc's pthread_create tries clone3 first and falls back to clone on
    // ENOSYS: the thread starts, and the filter is on it too.
    let rhel8 = probe(Some("rhel8"), &["thread:39", "thread:435", "thread:425"]);
    assert_eq!(answer(&rhel8, "thread:39"), "ok");
    assert_eq!(answer(&rhel8, "thread:435"), "ENOSYS");
    assert_eq!(answer(&rhel8, "thread:425"), "ENOSYS");
}

#[test]
fn rhel8_filter_reaches_grandchildren_through_a_shell() {
    // The launcher execs sh, which forks an inner sh, which forks the probe:
    // the probe is a grandchild of the launched command. The trailing
    // echos keep each shell from exec'ing its last command in place.
    let script = r#"sh -c '"$PROBE" --probe 425 451 435 39; echo inner-done'; echo outer-done"#;
    let output = Command::new(LAUNCHER)
        .args(["rhel8", "--", "sh", "-c", script])
        .env("PROBE", LAUNCHER)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(stdout.ends_with("inner-done\nouter-done\n"), "{stdout}");
    let answers = answers(&output, 4);
    for refused in ["425", "451", "435"] {
        assert_eq!(answer(&answers, refused), "ENOSYS", "{refused}");
    }
    assert_eq!(answer(&answers, "39"), "ok");
}

#[test]
fn the_launched_command_is_told_its_profile() {
    let output = Command::new(LAUNCHER)
        .args(["uring-disabled", "sh", "-c", "echo \"$KERNEL_PROFILE\""])
        .output()
        .expect("runs");
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout), "uring-disabled\n");
}

#[test]
fn uring_disabled_refuses_io_uring_with_eperm_and_nothing_else() {
    let tokens = ["425", "426", "427", "451", "435", "434", "448", "449", "39"];
    let host = probe(None, &tokens);
    let disabled = probe(Some("uring-disabled"), &tokens);
    for refused in ["425", "426", "427"] {
        assert_eq!(answer(&disabled, refused), "EPERM", "{refused}");
    }
    for untouched in &tokens[3..] {
        assert_eq!(
            answer(&disabled, untouched),
            answer(&host, untouched),
            "{untouched}"
        );
    }
}

#[test]
fn container_refuses_unshare_and_io_uring_with_eperm_and_nothing_else() {
    let tokens = ["272", "425", "426", "427", "451", "435", "434", "39"];
    let host = probe(None, &tokens);
    let container = probe(Some("container"), &tokens);
    for refused in ["272", "425", "426", "427"] {
        assert_eq!(answer(&container, refused), "EPERM", "{refused}");
    }
    // (unshare's probe has unknown flags: the kernel itself says EINVAL.)
    assert_eq!(answer(&host, "272"), "EINVAL");
    for untouched in &tokens[4..] {
        assert_eq!(
            answer(&container, untouched),
            answer(&host, untouched),
            "{untouched}"
        );
    }
}

#[test]
fn rhel9_refuses_io_uring_and_calls_after_5_14() {
    let tokens = [
        "425", "426", "427", "448", "449", "451", "447", "435", "439", "424", "39",
    ];
    let host = probe(None, &tokens);
    let rhel9 = probe(Some("rhel9"), &tokens);
    for refused in ["425", "426", "427", "448", "449", "451"] {
        assert_eq!(answer(&rhel9, refused), "ENOSYS", "{refused}");
    }
    // memfd_secret is 5.14's last call: the filter leaves it to the kernel
    // (which here refuses the probe's bad flags with EINVAL).
    for untouched in ["447", "435", "439", "424", "39"] {
        assert_eq!(
            answer(&rhel9, untouched),
            answer(&host, untouched),
            "{untouched}"
        );
    }
    assert_ne!(
        answer(&host, "449"),
        "ENOSYS",
        "futex_waitv exists on the host"
    );
}

#[test]
fn x32_calls_are_refused_under_every_profile() {
    for profile in ["rhel8", "rhel9", "uring-disabled", "container"] {
        let answers = probe(Some(profile), &["x32:39", "x32:425", "39"]);
        assert_eq!(answer(&answers, "x32:39"), "ENOSYS", "{profile}");
        assert_eq!(answer(&answers, "x32:425"), "ENOSYS", "{profile}");
        assert_eq!(answer(&answers, "39"), "ok", "{profile}");
    }
}

#[test]
fn a_32_bit_call_kills_the_process() {
    let host = Command::new(LAUNCHER)
        .args(["--probe", "i386:20"])
        .output()
        .expect("runs");
    if !host.status.success() {
        eprintln!(
            "skipped: this kernel does not run 32-bit calls ({})",
            host.status
        );
        return;
    }
    for profile in ["rhel8", "rhel9", "uring-disabled", "container"] {
        let output = Command::new(LAUNCHER)
            .args([profile, "--", LAUNCHER, "--probe", "39", "i386:20"])
            .output()
            .expect("runs");
        assert_eq!(
            output.status.signal(),
            Some(SIGSYS),
            "{profile}: {}",
            output.status
        );
        // The native call before it was answered.
        assert!(String::from_utf8_lossy(&output.stdout).starts_with("39 getpid ok"));
    }
}

#[test]
fn unknown_profiles_are_refused_with_the_known_ones_listed() {
    let output = Command::new(LAUNCHER)
        .args(["rhel7", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "unknown profile 'rhel7' (known profiles: rhel8, rhel9, uring-disabled, container)"
        ),
        "{stderr}"
    );
}

#[test]
fn a_missing_command_is_reported_like_env_does() {
    let output = Command::new(LAUNCHER)
        .args(["rhel8", "--", "/nonexistent/command"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot run /nonexistent/command"),
        "{stderr}"
    );
}

#[test]
fn the_command_exit_status_is_passed_through() {
    let status = Command::new(LAUNCHER)
        .args(["rhel9", "sh", "-c", "exit 7"])
        .status()
        .expect("runs");
    assert_eq!(status.code(), Some(7));
}
