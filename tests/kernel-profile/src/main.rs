//! `kernel-profile PROFILE [--] COMMAND [ARGS...]`: runs COMMAND under a
//! seccomp profile (see the library's docs and `docs/kernel-profiles.md`).
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

use kernel_profile::filter;
use kernel_profile::probe;
use kernel_profile::profile::Profile;

/// The variable the launched command finds its profile's name in.
const PROFILE_VARIABLE: &str = "KERNEL_PROFILE";

/// Wrong usage, as clap and env(1) say it.
const EXIT_USAGE: u8 = 2;
/// env(1)'s codes for a command that cannot be run and one that is not found.
const EXIT_CANNOT_RUN: u8 = 126;
const EXIT_NOT_FOUND: u8 = 127;

fn usage() -> String {
    let mut text = String::from(
        "Usage: kernel-profile PROFILE [--] COMMAND [ARGS...]\n       \
         kernel-profile --list\n\n\
         Runs COMMAND under a seccomp filter that answers system calls as a RHEL\n\
         kernel does. Every process and thread COMMAND starts inherits the filter;\n\
         COMMAND finds the profile's name in $KERNEL_PROFILE.\n\nProfiles:\n",
    );
    for profile in Profile::ALL {
        text.push_str(&format!("  {:<15} {}\n", profile.name(), profile.summary()));
    }
    text
}

#[derive(Debug)]
enum Invocation {
    Help,
    List,
    Probe(Vec<String>),
    Run {
        profile: Profile,
        command: OsString,
        args: Vec<OsString>,
    },
}

fn parse(mut args: Vec<OsString>) -> Result<Invocation, String> {
    if args.is_empty() {
        return Err("a profile and a command are needed".to_owned());
    }
    let first = args.remove(0);
    match first.to_str() {
        Some("-h" | "--help") => return Ok(Invocation::Help),
        Some("--list") => return Ok(Invocation::List),
        Some("--probe") => {
            let tokens = args
                .into_iter()
                .map(|a| {
                    a.into_string()
                        .map_err(|a| format!("{a:?} is not a number"))
                })
                .collect::<Result<_, _>>()?;
            return Ok(Invocation::Probe(tokens));
        }
        _ => {}
    }
    let name = first
        .to_str()
        .ok_or_else(|| format!("{first:?} is not a profile name"))?;
    let profile = Profile::from_name(name).map_err(|e| e.to_string())?;
    if args.first().is_some_and(|a| a == "--") {
        args.remove(0);
    }
    if args.is_empty() {
        return Err(format!("a command to run under {profile} is needed"));
    }
    let command = args.remove(0);
    Ok(Invocation::Run {
        profile,
        command,
        args,
    })
}

/// The profiles are lists of x86_64 system call numbers: anywhere else they
/// would refuse the wrong calls.
fn check_architecture() -> Result<(), String> {
    if cfg!(target_arch = "x86_64") {
        Ok(())
    } else {
        Err(format!(
            "the profiles are written for x86_64 system call numbers; this is {}",
            std::env::consts::ARCH
        ))
    }
}

fn launch(profile: Profile, command: OsString, args: Vec<OsString>) -> ExitCode {
    let program = match filter::compile(profile) {
        Ok(program) => program,
        Err(e) => {
            eprintln!("kernel-profile: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = filter::install(&program) {
        eprintln!("kernel-profile: {e}");
        return ExitCode::FAILURE;
    }
    // exec only returns if it failed.
    let error = Command::new(&command)
        .args(args)
        .env(PROFILE_VARIABLE, profile.name())
        .exec();
    eprintln!(
        "kernel-profile: cannot run {}: {error}",
        command.to_string_lossy()
    );
    ExitCode::from(if error.kind() == io::ErrorKind::NotFound {
        EXIT_NOT_FOUND
    } else {
        EXIT_CANNOT_RUN
    })
}

fn main() -> ExitCode {
    let invocation = match parse(std::env::args_os().skip(1).collect()) {
        Ok(invocation) => invocation,
        Err(message) => {
            eprintln!("kernel-profile: {message}\n\n{}", usage());
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Invocation::Probe(_) | Invocation::Run { .. } = invocation {
        if let Err(message) = check_architecture() {
            eprintln!("kernel-profile: {message}");
            return ExitCode::from(EXIT_USAGE);
        }
    }
    match invocation {
        Invocation::Help => {
            print!("{}", usage());
            ExitCode::SUCCESS
        }
        Invocation::List => {
            for profile in Profile::ALL {
                println!("{}\t{}", profile.name(), profile.summary());
            }
            ExitCode::SUCCESS
        }
        Invocation::Probe(tokens) => match probe::run(&tokens) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("kernel-profile --probe: {message}");
                ExitCode::from(EXIT_USAGE)
            }
        },
        Invocation::Run {
            profile,
            command,
            args,
        } => launch(profile, command, args),
    }
}
