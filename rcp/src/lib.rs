//! # rcp: copy files over the fabric, verified end to end
//!
//! `rcp SRC... DEST` as scp, with the data path on rfabric links (RDMA when
//! a device routes to the peer, else tcp). The sender reads with io_uring
//! into registered buffers and writes each chunk one-sidedly into the
//! receiver's landing slots as soon as a credit is free; the receiver writes
//! them out with io_uring and returns the credit. Every chunk is hashed with
//! BLAKE3 (or SHA-256) on both sides; files arrive under temporary names and are renamed
//! only when complete, verified and synced.
//!
//! Rooms: [`app`] (what a command line does: push, pull, local copy or
//! broadcast),
//! [`daemon`] (`rcp serve` and the far side of remote-shell mode),
//! [`cli`] (the command line, as clap sees it), [`tuning`] (the storage
//! engine and a session's parameters from the flags), [`operand`] (what
//! the user typed), [`proto`] (control messages, sans I/O), `rfabric::auth`
//! (challenge-response), [`tree`] (confined filesystem work), [`archive`] (owners, xattrs, ACLs,
//! special files and hard links: rsync's `-o -g -D -X -A -H`), [`send`] and
//! [`recv`] (the two pipelines), [`arrivals`] (the receiver's rules of what
//! may arrive when, sans I/O) and [`resume`] (the `Have` exchange, sans
//! I/O), [`resync`] (which files are sent again: the quick check and its
//! variants, sans I/O) and [`existing`] (what a re-sync finds at the
//! destination), [`delete`] (`--delete`, after the copy), [`staying`] (helper threads
//! for the system calls of many names), [`filter`]
//! (rsync's include and exclude rules, sans I/O), [`idmap`] (`--usermap`,
//! `--groupmap`, `--chown`, sans I/O), [`listed`]
//! (`--files-from` lists, sans I/O),
//! [`session`] (auth, request, pipelines),
//! [`streams`] (striping a session over several links), [`broadcast`]
//! (one source to a host list's nodes) with [`chain`] (a node's onward
//! hop), [`merge`] (a node's answers merged with the next node's, sans
//! I/O) and [`hostlist`] (Slurm's host lists, sans I/O), [`connect`]
//! (transport choice), [`shell`] (remote-shell mode), [`report`] (progress,
//! the summary and the `--json` object, the outcome), [`digest`] (the
//! digest definition, and the one hex encoder).
//!
//! The binary (`main.rs`) only parses, starts the runtime and maps the
//! outcome to the exit status.
#![forbid(unsafe_code)]

pub mod app;
pub mod archive;
pub mod arrivals;
pub mod backup;
pub mod broadcast;
pub mod chain;
pub mod chmod;
pub mod cli;
pub mod connect;
pub mod daemon;
pub mod delete;
pub mod digest;
pub mod existing;
pub mod exit;
pub mod filter;
pub mod hostlist;
pub mod idmap;
pub mod linkdest;
pub mod listed;
pub mod merge;
pub mod operand;
pub mod pace;
pub mod proto;
pub mod recv;
pub mod report;
pub mod resume;
pub mod resync;
pub mod send;
pub mod session;
pub mod shell;
pub mod staying;
pub mod streams;
pub mod tree;
pub mod tuning;
