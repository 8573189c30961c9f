//! `docgen OUTDIR`: man pages (`OUTDIR/man/*.1`) and bash, zsh and fish
//! completions (`OUTDIR/completions/`) for rcp and rblock, generated from
//! the same clap definitions the binaries parse with, so the docs follow
//! the command lines.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Command, CommandFactory};
use clap_complete::Shell;

fn main() -> ExitCode {
    let Some(out) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: docgen OUTDIR");
        return ExitCode::from(2);
    };
    match generate(&out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("docgen: {e}");
            ExitCode::FAILURE
        }
    }
}

fn generate(out: &Path) -> std::io::Result<()> {
    let man = out.join("man");
    let completions = out.join("completions");
    std::fs::create_dir_all(&man)?;
    for shell in ["bash", "zsh", "fish"] {
        std::fs::create_dir_all(completions.join(shell))?;
    }
    for cmd in [rcp::cli::Cli::command(), rblock::cli::Cli::command()] {
        let cmd = cmd.version(env!("CARGO_PKG_VERSION"));
        man_pages(&cmd, &man)?;
        let name = cmd.get_name().to_string();
        for (shell, dir, file) in [
            (Shell::Bash, "bash", name.clone()),
            (Shell::Zsh, "zsh", format!("_{name}")),
            (Shell::Fish, "fish", format!("{name}.fish")),
        ] {
            let mut f = std::fs::File::create(completions.join(dir).join(file))?;
            clap_complete::generate(shell, &mut cmd.clone(), &name, &mut f);
        }
    }
    Ok(())
}

/// `NAME.1`, and `NAME-SUB.1` for each visible subcommand.
fn man_pages(cmd: &Command, dir: &Path) -> std::io::Result<()> {
    let name = cmd.get_name().to_string();
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    std::fs::write(dir.join(format!("{name}.1")), page)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let full = format!("{name}-{}", sub.get_name());
        let sub = sub
            .clone()
            .name(full.clone())
            .version(env!("CARGO_PKG_VERSION"));
        let mut page = Vec::new();
        clap_mangen::Man::new(sub).render(&mut page)?;
        std::fs::write(dir.join(format!("{full}.1")), page)?;
    }
    Ok(())
}
