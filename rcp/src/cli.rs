//! The command line, as clap sees it: here in the library so that the man
//! page and the shell completions are generated from the same definitions
//! (`packaging/docgen`).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::digest::Choice as DigestChoice;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use rfabric::endpoint::Transport;
use rfabric::link::seal::EncryptChoice;
use rfabric::storage::EngineChoice;

/// Copy files between nodes over RDMA (or TCP), pipelined, verified end
/// to end (BLAKE3, or SHA-256) and authenticated, encrypted over TCP.
///
/// As rsync, a file already at the destination with the same size and
/// modification time is skipped (-c compares contents instead, -I sends
/// everything), so running the same copy again sends only what changed.
///
/// Operands are local paths, [user@]host:path (rcp is started on the far
/// side through --rsh, as scp does), or rcp://host[:port]/path (a running
/// `rcp serve`, which needs --secret-file). The last operand is the
/// destination. Files appear under their final name only once complete,
/// verified and synced to disk.
#[derive(Parser, Debug)]
#[command(
    name = "rcp",
    version,
    // (`-h` is rsync's --human-readable, which rsync's users type with
    // -av; `--help` and a lone `-h` print the help.)
    disable_help_flag = true,
    // (A flag given twice is given, as rsync takes it: `-t --no-t -t`.)
    args_override_self = true,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_long_help = "Exit status:\n  \
                       0  every file arrived and was verified\n  \
                       1  the copy ran, and some files failed (each is named on stderr)\n  \
                       2  bad usage\n  \
                       3  refused: authentication failed, or the server turned the request \
                       down (outside its roots, busy)\n  \
                       4  verification failed: data arrived corrupted, or data or messages \
                       were changed on the path (nothing corrupted is kept under its final \
                       name)\n  \
                       5  a local I/O error stopped the copy\n  \
                       6  the peer could not be reached, or was lost mid-copy"
)]
pub struct Cli {
    /// Print help (as does -h alone).
    #[arg(long, action = clap::ArgAction::Help, global = false)]
    pub help: Option<bool>,
    #[command(subcommand)]
    pub command: Option<Cmd>,
    #[command(flatten)]
    pub copy: CopyArgs,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Run the rcp daemon: serve copies to and from the given roots.
    Serve(ServeArgs),
    /// Internal: the far side of remote-shell mode (one session, then exit).
    #[command(hide = true)]
    ServerOnce(ServerOnceArgs),
}

#[derive(Args, Debug, Clone)]
pub struct Tuning {
    /// Bytes per chunk (suffixes K, M); a broadcast's default is 256K
    /// (each node hands a chunk on once it is whole: smaller chunks keep
    /// the chain's nodes closer together).
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub chunk_size: usize,
    /// Chunks in flight: landing slots of the receiver.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub window: u32,
    /// Transport for the data: auto picks RDMA when a device routes to the
    /// peer, else TCP.
    #[arg(long, value_enum, default_value_t = Transport::Auto)]
    pub transport: Transport,
    /// Storage engine for reading and writing files: auto uses io_uring
    /// where the kernel allows it (not on RHEL 8 or 9.0-9.2, refused by
    /// default on 9.3+ and 10) and a pool of threads elsewhere, saying so
    /// once; io_uring insists on it (an error where refused). In
    /// remote-shell mode the far side is asked for the same.
    #[arg(long, value_enum, default_value_t = EngineChoice::Auto, value_name = "ENGINE")]
    pub io_engine: EngineChoice,
    /// When the session is encrypted (AES-256-GCM with keys only the two
    /// ends hold): tcp encrypts over TCP, which crosses ordinary networks,
    /// and leaves RDMA in clear; always encrypts RDMA too. Every message
    /// and chunk is authenticated in any case. A copy between two local
    /// paths crosses no network: its two ends, in one process, are
    /// sealed (then encrypted) only with always. For
    /// `rcp serve` this is what clients must accept: a client that asks
    /// for less is refused.
    #[arg(long, value_enum, default_value_t = EncryptChoice::Tcp, value_name = "WHEN")]
    pub encrypt: EncryptChoice,
    /// Seconds the peer may send nothing at all before the copy stops
    /// with the peer taken for lost (exit status 6). Both ends send a
    /// heartbeat every second while they wait, so only a peer that is
    /// gone (its host down, the path cut, the process stopped) falls
    /// silent. A receiver also waits at most this long for a file
    /// another copy to the same place is still writing. 0 waits for ever.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub timeout: u64,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("recursion").args(["recursive", "archive"]).multiple(true)))]
pub struct CopyArgs {
    /// Sources, then the destination.
    #[arg(value_name = "SRC... DEST", num_args = 2.., required = true)]
    pub operands: Vec<String>,
    /// Copy directories recursively (symlinks are copied as symlinks).
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// Preserve modes and modification times (to the nanosecond), as
    /// scp's -p (rsync's -p is --perms).
    #[arg(short = 'p', long)]
    pub preserve: bool,
    /// Preserve modes exactly (rsync's -p).
    #[arg(long)]
    pub perms: bool,
    /// Preserve modification times, to the nanosecond (rsync's -t).
    #[arg(short = 't', long)]
    pub times: bool,
    /// Copy symlinks as symlinks: what rcp does anyway unless -L or
    /// --copy-unsafe-links (accepted for rsync's -l and -rlptgoD).
    #[arg(short = 'l', long)]
    pub links: bool,
    /// Keep no modes, even with -a or -p: a new file gets the source's
    /// permission bits under the umask, a file that replaces one the mode
    /// of the one it replaces.
    #[arg(long, alias = "no-p")]
    pub no_perms: bool,
    /// Leave modification times as the copy makes them, even with -a or
    /// -p (rsync's quick check then finds every file changed).
    #[arg(long, alias = "no-t")]
    pub no_times: bool,
    /// No owners, even with -a.
    #[arg(long, alias = "no-o", overrides_with = "owner")]
    pub no_owner: bool,
    /// No groups, even with -a.
    #[arg(long, alias = "no-g", overrides_with = "group")]
    pub no_group: bool,
    /// No device nodes, FIFOs or sockets, even with -a.
    #[arg(long, alias = "no-D", overrides_with = "devices")]
    pub no_devices: bool,
    /// Not recursive, even with -a (as rsync's -a --no-r).
    #[arg(long, alias = "no-r", overrides_with = "recursive")]
    pub no_recursive: bool,
    /// Archive mode, as rsync's -a: -r -p -o -g -D (symlinks are always
    /// copied as symlinks). Add -H, -A and -X for rsync's -aHAX.
    #[arg(short = 'a', long)]
    pub archive: bool,
    /// Preserve owners (numeric ids; applied where the receiver runs as
    /// root, and for rcp serve with --allow-owners).
    #[arg(short = 'o', long)]
    pub owner: bool,
    /// Preserve groups (numeric ids; as a user, only to groups of theirs).
    #[arg(short = 'g', long)]
    pub group: bool,
    /// Copy device nodes (as root), FIFOs and sockets.
    #[arg(short = 'D', long = "devices")]
    pub devices: bool,
    /// Preserve hard links: files with several names get them all, as
    /// links, on the other side.
    #[arg(short = 'H', long)]
    pub hard_links: bool,
    /// Preserve POSIX ACLs (access and default).
    #[arg(short = 'A', long)]
    pub acls: bool,
    /// Preserve extended attributes: user.* always, trusted.* and
    /// security.* where the receiver runs as root.
    #[arg(short = 'X', long)]
    pub xattrs: bool,
    /// Owners and groups go by number, not name (what rcp always does on
    /// the wire). With --usermap or --groupmap, as rsync: no id counts as
    /// having a name, so only numbers, ranges, `*` and the empty FROM match.
    #[arg(long)]
    pub numeric_ids: bool,
    /// Change owners on the way, as rsync: FROM:TO pairs separated by
    /// commas, the first match deciding. FROM is an id, a range LOW-HIGH,
    /// a user name, a wildcard over names (`*` for every id), or empty
    /// for ids without a name; TO is a name or an id. Names are looked
    /// up on this host (where rcp was started). Implies -o: owners are
    /// set where the receiver runs as root (rcp serve: with
    /// --allow-owners). Example: --usermap '0-99:nobody,wayne:admin'.
    #[arg(long, value_name = "FROM:TO,...")]
    pub usermap: Option<String>,
    /// The same for groups. Implies -g: a receiver that is not root sets
    /// only groups its user is in.
    #[arg(long, value_name = "FROM:TO,...")]
    pub groupmap: Option<String>,
    /// Give everything copied to USER and GROUP: USER:GROUP, USER or
    /// :GROUP (--usermap '*:USER' --groupmap '*:GROUP'; implies -o, -g
    /// for the half given).
    #[arg(long, value_name = "USER:GROUP", conflicts_with_all = ["usermap", "groupmap"])]
    pub chown: Option<String>,
    /// Skip the digest checks (faster; a corrupted chunk goes unnoticed).
    #[arg(long)]
    pub no_verify: bool,
    /// What every chunk and file is checked with: blake3 (several times
    /// faster per core), sha256 (FIPS-approved), or auto: blake3, except
    /// on a host in FIPS mode (/proc/sys/crypto/fips_enabled), where it is
    /// sha256 and blake3 is refused.
    #[arg(long, value_enum, default_value_t = DigestChoice::Auto, value_name = "ALGORITHM")]
    pub digest: DigestChoice,
    /// Finish an interrupted copy: keep what reached the destination and
    /// send only the chunks that are missing or differ (also updates an
    /// existing destination file that way).
    #[arg(long)]
    pub resume: bool,
    /// Keep what arrived of a file when the copy is cut off (the
    /// connection lost, the other side stopped), as .rcp-NAME.part beside
    /// it, and take it up in the next copy with --partial: only the
    /// chunks it lacks are sent. Without it, what arrived is removed.
    /// (Files of one chunk come whole again, and so does every file with
    /// -I.)
    #[arg(long)]
    pub partial: bool,
    /// Copy a symlink to a directory as that directory, under the
    /// symlink's name (as rsync's -k; -L follows every symlink). Not from
    /// rcp serve, which follows no symlink.
    #[arg(short = 'k', long)]
    pub copy_dirlinks: bool,
    /// Pass over a source named (an operand, a --files-from name) that is
    /// not there, without a word (without it such a source fails alone,
    /// the rest is copied, and the copy ends with status 1).
    #[arg(long)]
    pub ignore_missing_args: bool,
    /// Leave directories' modification times as the copy makes them, even
    /// with -a, -p or -t (as rsync's -O: for file systems that cannot set
    /// them, or where they do not matter).
    #[arg(short = 'O', long)]
    pub omit_dir_times: bool,
    /// Make the destination's missing directories first, as mkdir -p
    /// (without it, only the last name of the destination may be
    /// missing). A destination that ends in / is a directory: made too,
    /// and the copy goes into it.
    #[arg(long)]
    pub mkpath: bool,
    /// --partial --progress, as rsync's -P.
    #[arg(short = 'P')]
    pub partial_progress: bool,
    /// Not supported: refused with the reason (rcp keeps what arrived as
    /// .rcp-NAME.part beside the file: --partial).
    #[arg(long, hide = true, value_name = "DIR")]
    pub partial_dir: Option<PathBuf>,
    /// Not supported: refused with the reason (rcp never writes into a
    /// file under its final name).
    #[arg(long, hide = true)]
    pub inplace: bool,
    /// Not supported: as --inplace.
    #[arg(long, hide = true)]
    pub append: bool,
    /// Not supported: as --inplace.
    #[arg(long, hide = true)]
    pub append_verify: bool,
    /// Compare files by chunk digests instead of size and time: a file
    /// whose contents changed (whatever its size and time say) is updated
    /// with only the chunks that differ; one whose contents are equal is
    /// left as it is.
    #[arg(short = 'c', long, conflicts_with_all = ["size_only", "ignore_times"])]
    pub checksum: bool,
    /// Skip a file that exists with the same size, whatever its time
    /// (by default, the same size and modification time).
    #[arg(long, conflicts_with = "ignore_times")]
    pub size_only: bool,
    /// Send every file whole, even one that is there with the same size
    /// and time.
    #[arg(short = 'I', long)]
    pub ignore_times: bool,
    /// Leave every name that exists at the destination as it is; copy
    /// only what is missing.
    #[arg(long)]
    pub ignore_existing: bool,
    /// Make nothing new at the destination: only names there already are
    /// updated (a directory that is not there is left out, and all in
    /// it). With --ignore-existing, nothing is copied: only --delete acts.
    #[arg(long, alias = "ignore-non-existing")]
    pub existing: bool,
    /// Leave a file that is newer at the destination as it is.
    #[arg(short = 'u', long)]
    pub update: bool,
    /// Take modification times at most NUM seconds apart for the same:
    /// in the quick check, --update, --link-dest and -i, and a time
    /// within NUM of the source's is left as it is (a file written gets
    /// the source's exactly). rcp compares times to the nanosecond by
    /// default, as rsync does with a negative NUM; 0 compares whole
    /// seconds (rsync's default), and 1 suits a FAT file system on
    /// either side, which keeps times to 2 seconds.
    #[arg(short = '@', long, value_name = "NUM", allow_negative_numbers = true)]
    pub modify_window: Option<i64>,
    /// Leave out files larger than SIZE (rsync's units: 500K and 1.5G are
    /// powers of 1024, 500KB of 1000, and +1 or -1 after one adds or
    /// takes a byte). What the destination holds under their names stays,
    /// even with --delete.
    #[arg(long, value_name = "SIZE", value_parser = parse_file_size)]
    pub max_size: Option<u64>,
    /// Link a file the copy would send from DIR instead, where DIR (an
    /// earlier snapshot, laid out as the destination) holds it unchanged:
    /// the same size and time (or size, with --size-only) and the same
    /// metadata as the copy would give it. A relative DIR is relative to
    /// the destination directory (--link-dest=../prev). Up to 20, looked
    /// in in order.
    #[arg(long, value_name = "DIR")]
    pub link_dest: Vec<PathBuf>,
    /// Leave out files smaller than SIZE (as --max-size).
    #[arg(long, value_name = "SIZE", value_parser = parse_file_size)]
    pub min_size: Option<u64>,
    /// Hold the data to RATE bytes a second, in KiB where no unit is given
    /// (as rsync's: 500 is 500 KiB/s, 1.5M is 1.5 MiB/s, 10MB is 10
    /// million bytes); 0 for no limit. The side you run paces: a push
    /// what it sends, a pull what it takes in.
    #[arg(long, value_name = "RATE", value_parser = parse_bwlimit)]
    pub bwlimit: Option<u64>,
    /// Remove what the destination directories hold that the source does
    /// not: only inside the directories copied, never through a symlink,
    /// and only once the whole copy succeeded (a failed copy deletes
    /// nothing). Needs -r or -a. rsync's --delete-after and
    /// --delete-delay are this; its --delete-before, --delete-during and
    /// --del are taken as this too (rcp deletes after the copy always).
    #[arg(
        long,
        requires = "recursion",
        visible_aliases = ["delete-after", "delete-delay"],
        aliases = ["delete-before", "delete-during", "del"]
    )]
    pub delete: bool,
    /// With --delete, remove what the --exclude rules exclude at the
    /// destination too (without it, excluded names there are left alone).
    #[arg(long, requires = "delete")]
    pub delete_excluded: bool,
    /// Where the source has a file, symlink or special file and the
    /// destination a directory with something in it, remove that
    /// directory and all in it (except what --exclude rules protect), as
    /// --delete does. Without either, such a directory stays and the entry
    /// fails; an empty one is always replaced.
    #[arg(long)]
    pub force: bool,
    /// Keep what the copy replaces or deletes at the destination, renamed
    /// to NAME~ beside it (see --suffix, --backup-dir) instead of lost.
    /// Without --backup-dir, --delete leaves names ending in the suffix,
    /// and directory times are not set (as rsync).
    #[arg(short = 'b', long)]
    pub backup: bool,
    /// Put the backups (-b, which this implies) in DIR, laid out as the
    /// destination: DIR/path/NAME. A relative DIR is relative to the
    /// destination directory (--backup-dir=../backup-2026-12-06); it must
    /// be on the destination's file system, and is made if missing.
    #[arg(long, value_name = "DIR")]
    pub backup_dir: Option<PathBuf>,
    /// What a backup's name ends in: ~ by default, nothing with
    /// --backup-dir (a suffix may be empty only then).
    #[arg(long, value_name = "SUFFIX")]
    pub suffix: Option<String>,
    /// Change the permissions of what is sent, as chmod(1) would, before
    /// they are applied: comma-separated rules such as go-w, u=rwX,
    /// Dg+s (D: directories only, F: everything else), or an octal mode;
    /// repeat for more. Rules that name no one (+x) leave your umask's
    /// bits alone, as chmod's do.
    #[arg(long, value_name = "RULES")]
    pub chmod: Vec<String>,
    /// Delete at most NUM entries with --delete (files and directories,
    /// in rsync's order); what is past the limit stays, and the copy says
    /// how many and fails. With 0 nothing goes: a count of what would.
    #[arg(long, value_name = "NUM", requires = "delete")]
    pub max_delete: Option<u64>,
    /// Keep to each source's file system: a directory on another one (a
    /// mount point) is copied as an empty directory, and --delete leaves
    /// what the destination's copy of it holds and deletes nothing on
    /// another file system than the destination's. Twice (-xx): leave
    /// such directories out altogether.
    #[arg(short = 'x', long, action = clap::ArgAction::Count)]
    pub one_file_system: u8,
    /// Copy what each symlink points to (a file, or a directory and what
    /// is in it) in place of the symlink, under its name. A symlink whose
    /// target is missing or cannot be read, or that leads to a directory
    /// it is in, fails alone and is left out. Not from `rcp serve`, which
    /// keeps to its roots.
    #[arg(short = 'L', long)]
    pub copy_links: bool,
    /// Copy what a symlink points to where it leads outside the copied
    /// tree (an absolute target, or one whose `..` climb above the
    /// directory copied); symlinks inside it stay symlinks.
    #[arg(long)]
    pub copy_unsafe_links: bool,
    /// Leave out the symlinks that lead outside the copied tree: nothing
    /// is made of them, and what the destination holds under their names
    /// stays, even with --delete (with --copy-unsafe-links, what they
    /// point to is copied instead).
    #[arg(long)]
    pub safe_links: bool,
    /// Remove from the source each file (not directory) that was copied or
    /// found unchanged at the destination, once the whole copy is over,
    /// verified and on disk there. A file that changed since it was sent
    /// (size or time), that failed, or that --ignore-existing or --update
    /// left alone stays. Not from `rcp serve`, nor in a broadcast.
    #[arg(long)]
    pub remove_source_files: bool,
    /// Show what would be done and do nothing: no data is sent and the
    /// destination is not touched (with -i, each change is named).
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Sizes and rates are shown with units (rcp's always are): accepted
    /// for rsync's -avh. Alone, -h prints the help.
    #[arg(short = 'h', long)]
    pub human_readable: bool,
    /// Show the progress of the copy: rcp does on a terminal unless -q
    /// (accepted for rsync's --progress).
    #[arg(long)]
    pub progress: bool,
    /// Not supported: rcp does not compress (over RDMA and fast networks
    /// compressing costs more time than it saves); refused with a usage
    /// error rather than ignored.
    #[arg(short = 'z', long, hide = true)]
    pub compress: bool,
    /// Name on stdout what is sent, made, linked or removed (`deleting
    /// NAME`), one a line, as rsync's -v does; a change of attributes
    /// alone is not named (-i names every change, with its code).
    /// Repeating it (-vv) changes nothing more.
    #[arg(short = 'v', long, action = clap::ArgAction::Count, conflicts_with = "json")]
    pub verbose: u8,
    /// rsync's --info=FLAGS (comma-separated), as far as rcp has them:
    /// progress0, progress1, progress2 (rcp shows the whole copy's
    /// progress on a terminal anyway, unless -q), name0 (no -v), name1
    /// and name2 (-v). Others are refused.
    #[arg(long, value_name = "FLAGS", value_parser = parse_info)]
    pub info: Vec<Info>,
    /// Print rsync's --stats lines for what rcp counts (regular files,
    /// those transferred, entries deleted, data bytes sent) on stdout at
    /// the end. --json has them all.
    #[arg(long, conflicts_with = "json")]
    pub stats: bool,
    /// Send whole files: what rcp does anyway (it has no delta transfer;
    /// -c, --resume and --partial still send only the chunks that differ).
    /// Accepted for rsync's -W.
    #[arg(short = 'W', long)]
    pub whole_file: bool,
    /// Keep holes: what rcp does anyway (only the chunks holding data
    /// travel). Accepted for rsync's -S.
    #[arg(short = 'S', long)]
    pub sparse: bool,
    /// Name each change on stdout with rsync's 11-letter code (`>f+++++++++
    /// path` for a new file, `>f.st......` for one sent again, `.f...p.....`
    /// for a mode set, `cd+++++++++` for a new directory, `*deleting` for
    /// what --delete removes).
    #[arg(short = 'i', long, conflicts_with = "json")]
    pub itemize_changes: bool,
    /// Leave out what PATTERN matches, with rsync's rules: `*` within a
    /// name, `**` across directories, a leading `/` anchors at the top of
    /// the copy (the source's own name), a trailing `/` matches only
    /// directories, `dir/***` is dir and all in it. An excluded directory
    /// is not descended into, and --delete leaves what is excluded. Repeat
    /// it; with --include and --exclude-from, the first rule that matches,
    /// in command-line order, decides.
    #[arg(long, value_name = "PATTERN")]
    pub exclude: Vec<OsString>,
    /// Keep what PATTERN matches even if a later --exclude matches it.
    #[arg(long, value_name = "PATTERN")]
    pub include: Vec<OsString>,
    /// Exclude patterns from FILE, one a line (`+ PATTERN` includes,
    /// `- PATTERN` excludes; blank lines and lines starting with # or ;
    /// are skipped).
    #[arg(long, value_name = "FILE")]
    pub exclude_from: Vec<PathBuf>,
    /// Leave out directories with nothing but directories beneath them,
    /// judged after the --exclude and --include rules (rsync's
    /// --prune-empty-dirs): `-m --include='*/' --include='*.c'
    /// --exclude='*'` copies the .c files and only the directories that
    /// lead to them. With --delete, a destination directory that the
    /// source has only empty is removed (unless rules protect what is in
    /// it).
    #[arg(short = 'm', long)]
    pub prune_empty_dirs: bool,
    /// Keep each source's path beneath the destination, as rsync's
    /// --relative: `rcp -aR src/a/b dest` makes dest/src/a/b, the
    /// directories above it made with their metadata. A /./ in the path
    /// marks where the kept part starts (`/home/./ann/notes` arrives as
    /// dest/ann/notes); without one an absolute path is kept whole. All
    /// sources must keep their paths from the same directory.
    #[arg(short = 'R', long, conflicts_with = "files_from")]
    pub relative: bool,
    /// Send the names listed in FILE (one a line, `-` for stdin), relative
    /// to the one source directory, each under its own name at the
    /// destination (made if missing), the directories above it made with
    /// their metadata: rsync's --files-from. A listed directory brings its
    /// contents only with an explicit -r (-a alone does not recurse here).
    /// Blank lines and lines starting with # or ; are skipped.
    #[arg(long, value_name = "FILE")]
    pub files_from: Option<PathBuf>,
    /// The --files-from list is separated by NUL bytes, not lines (as
    /// `find -print0` writes it); no comment lines.
    #[arg(long = "from0", short = '0', requires = "files_from")]
    pub from0: bool,
    /// The three above in command-line order (see [`parse`]).
    #[arg(skip)]
    pub rules: Vec<RuleArg>,
    /// --chunk-size was given (a broadcast's default is smaller: see
    /// [`crate::broadcast::CHUNK`]).
    #[arg(skip)]
    pub chunk_size_given: bool,
    /// Modes kept or not as the last of -p, --perms and --no-perms says
    /// (none given: as -a says).
    #[arg(skip)]
    pub modes_given: Option<bool>,
    /// Times kept or not as the last of -p, -t and --no-times says.
    #[arg(skip)]
    pub times_given: Option<bool>,
    /// Remote shell for host:path operands.
    #[arg(short = 'e', long, default_value = "ssh", value_name = "CMD")]
    pub rsh: String,
    /// Broadcast to the hosts listed in FILE (one a line, each may be a
    /// host list such as node[01-16]; # starts a comment); the destination
    /// is then :PATH, the path on every node.
    #[arg(long, value_name = "FILE", conflicts_with = "slurm")]
    pub hosts: Option<PathBuf>,
    /// Broadcast to the nodes of the current Slurm allocation
    /// (SLURM_JOB_NODELIST, read here: no scontrol needed); the
    /// destination is then :PATH.
    #[arg(long)]
    pub slurm: bool,
    /// The order of a broadcast's chain: named (as the host list names
    /// them), or topology: the nodes under one network switch next to one
    /// another (Slurm's SLURM_TOPOLOGY_ADDR; needs --launcher srun).
    #[arg(long, value_enum, default_value_t = Order::Named)]
    pub order: Order,
    /// How a broadcast starts rcp on its nodes: rsh runs --rsh once per
    /// node; srun runs one `srun --overlap` over all of them, inside the
    /// current Slurm allocation (or one it makes).
    #[arg(long, value_enum, default_value_t = Launcher::Rsh)]
    pub launcher: Launcher,
    /// A broadcast starts rcp on at most N nodes at once through --rsh
    /// (a thousand nodes are not a thousand ssh sessions at once).
    #[arg(long, default_value_t = 32, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub fanout_bootstrap: u32,
    /// Shared secret for rcp:// operands (a file readable only by you).
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Print one JSON object with the results on stdout.
    #[arg(long)]
    pub json: bool,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
    /// Connections (queue pairs) to stripe the data over; more than one
    /// helps when a single connection is the bottleneck (one core per
    /// connection on tcp, a NIC's per-QP limit on RDMA).
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=crate::proto::MAX_STREAMS as i64))]
    pub streams: u32,
    #[command(flatten)]
    pub tuning: Tuning,
}

impl CopyArgs {
    /// The `--usermap` and `--groupmap` texts, `--chown` turned into them.
    pub fn owner_maps(&self) -> Result<(Option<String>, Option<String>), crate::idmap::MapError> {
        match &self.chown {
            Some(spec) => crate::idmap::chown_maps(spec),
            None => Ok((self.usermap.clone(), self.groupmap.clone())),
        }
    }

    /// What `-a`, `-o`, `-g`, `-D`, `-H`, `-A` and `-X` keep (`-o` and
    /// `-g` also as a map implies them).
    pub fn keep(&self) -> crate::archive::Keep {
        // (A bad --chown is reported when the maps are made.)
        let (users, groups) = self.owner_maps().unwrap_or_default();
        crate::archive::Keep {
            owner: (self.owner || self.archive) && !self.no_owner || users.is_some(),
            group: (self.group || self.archive) && !self.no_group || groups.is_some(),
            devices: (self.devices || self.archive) && !self.no_devices,
            xattrs: self.xattrs,
            acls: self.acls,
            hard_links: self.hard_links,
        }
    }

    /// What the walk does with symlinks (`-L` over the others, as rsync).
    pub fn symlinks(&self) -> crate::tree::Symlinks {
        use crate::tree::Symlinks;
        if self.copy_links {
            Symlinks::Follow
        } else if self.copy_unsafe_links {
            Symlinks::FollowUnsafe
        } else if self.safe_links {
            Symlinks::SkipUnsafe
        } else {
            Symlinks::Keep
        }
    }

    /// Which files are sent again: by default a file there with the same
    /// size and modification time is skipped (rsync's quick check).
    pub fn policy(&self) -> crate::resync::Policy {
        use crate::resync::Check;
        let check = if self.checksum {
            Check::Checksum
        } else if self.size_only {
            Check::SizeOnly
        } else if self.ignore_times {
            Check::Never
        } else {
            Check::Quick
        };
        crate::resync::Policy {
            check,
            ignore_existing: self.ignore_existing,
            update: self.update,
            sizes: crate::resync::Sizes {
                min: self.min_size.unwrap_or(0),
                max: self.max_size.unwrap_or(u64::MAX),
            },
            existing: self.existing,
            times: self.modify_window.map_or(
                crate::resync::TimeMatch::Exact,
                crate::resync::TimeMatch::window,
            ),
        }
    }

    /// `-r`, or `-a` (not with --files-from, as rsync's).
    pub fn recursive(&self) -> bool {
        self.recursive || (self.archive && self.files_from.is_none() && !self.no_recursive)
    }

    /// `-v`, or `--info=name1` (`--info=name0` takes back `-v`; the
    /// last `--info` naming names counts).
    pub fn verbose(&self) -> bool {
        match self.info.iter().rev().find_map(|i| i.names) {
            Some(names) => names,
            None => self.verbose > 0,
        }
    }

    pub fn preserve(&self) -> crate::archive::Preserve {
        crate::archive::Preserve {
            modes: self.modes_given.unwrap_or(self.archive),
            times: self.times_given.unwrap_or(self.archive),
        }
    }
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Print help (`rcp`'s own -h is rsync's --human-readable; here it is
    /// the help, as usual).
    #[arg(short = 'h', long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Address and port to listen on (TCP, and RDMA where a device has it).
    #[arg(long, default_value = "127.0.0.1:7470")]
    pub listen: SocketAddr,
    /// A directory clients may read and write beneath; repeat for more.
    #[arg(long = "root", required = true, value_name = "DIR")]
    pub roots: Vec<PathBuf>,
    /// Shared secret clients must prove they know (mode 0600 or stricter).
    #[arg(long, value_name = "FILE")]
    pub secret_file: PathBuf,
    /// Sessions served at once; more are refused.
    #[arg(long, default_value_t = 64)]
    pub max_clients: usize,
    /// Let clients set owners and groups of what they send (-o, -g, -a)
    /// and create device nodes (-D) beneath the roots; takes effect only
    /// when the daemon runs as root. Without it a daemon keeps what it
    /// receives owned by itself and refuses device nodes.
    #[arg(long)]
    pub allow_owners: bool,
    #[command(flatten)]
    pub tuning: Tuning,
}

#[derive(Args, Debug)]
pub struct ServerOnceArgs {
    /// Print help.
    #[arg(short = 'h', long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    #[command(flatten)]
    pub tuning: Tuning,
    /// The connections the client will stripe over (its `--streams`):
    /// one runtime worker each. Passed only when more than one.
    #[arg(long, default_value_t = 1, hide = true,
          value_parser = clap::value_parser!(u32).range(1..=crate::proto::MAX_STREAMS as i64))]
    pub streams: u32,
}

/// The order of a broadcast's chain.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Named,
    Topology,
}

/// How a broadcast starts rcp on its nodes.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    Rsh,
    Srun,
}

/// One filter option, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleArg {
    Exclude(OsString),
    Include(OsString),
    ExcludeFrom(PathBuf),
}

/// The command line of this process (clap exits on bad usage).
pub fn parse() -> Cli {
    parse_from(std::env::args_os())
}

/// `args` parsed, with the filter options kept in their order (the first
/// matching rule decides, across --exclude, --include and --exclude-from),
/// which clap's derived fields do not keep.
pub fn parse_from(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> Cli {
    parse_args(args).unwrap_or_else(|e| e.exit())
}

/// [`parse_from`], with what clap refuses (or the help asked for) as the
/// error.
pub fn parse_args(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
) -> Result<Cli, clap::Error> {
    let mut args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    // (A lone `-h` asks for the help, as with rsync.)
    if args.len() == 2 && args[1] == "-h" {
        args[1] = "--help".into();
    }
    // (A flag given again is taken, the last counting; a map of owners
    // given twice is refused, as rsync's: the first would go unsaid.)
    for map in ["--usermap", "--groupmap", "--chown"] {
        let given = args
            .iter()
            .filter(|a| {
                let a = a.as_encoded_bytes();
                a == map.as_bytes() || a.starts_with(format!("{map}=").as_bytes())
            })
            .count();
        if given > 1 {
            let msg = format!("{map} may be given once");
            return Err(Cli::command().error(clap::error::ErrorKind::ArgumentConflict, msg));
        }
    }
    let matches = Cli::command().try_get_matches_from(args)?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    let c = &mut cli.copy;
    let at = |id: &str| -> Vec<usize> {
        matches
            .indices_of(id)
            .map(|i| i.collect())
            .unwrap_or_default()
    };
    let mut rules: Vec<(usize, RuleArg)> = Vec::new();
    rules.extend(
        at("exclude")
            .into_iter()
            .zip(c.exclude.iter().cloned().map(RuleArg::Exclude)),
    );
    rules.extend(
        at("include")
            .into_iter()
            .zip(c.include.iter().cloned().map(RuleArg::Include)),
    );
    rules.extend(
        at("exclude_from")
            .into_iter()
            .zip(c.exclude_from.iter().cloned().map(RuleArg::ExcludeFrom)),
    );
    rules.sort_by_key(|(i, _)| *i);
    c.rules = rules.into_iter().map(|(_, r)| r).collect();
    c.chunk_size_given =
        matches.value_source("chunk_size") == Some(clap::parser::ValueSource::CommandLine);
    // Of -p, --perms and --no-perms the last given decides modes; of -p,
    // -t and --no-times, times (-p is both, as scp's).
    let last = |ids: [&'static str; 3]| {
        ids.into_iter()
            .filter(|id| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
            .filter_map(|id| at(id).last().map(|i| (*i, id)))
            .max()
            .map(|(_, id)| id)
    };
    c.modes_given = last(["preserve", "perms", "no_perms"]).map(|id| id != "no_perms");
    c.times_given = last(["preserve", "times", "no_times"]).map(|id| id != "no_times");
    Ok(cli)
}

/// A file size as rsync reads one (`--max-size`, `--min-size`): a number,
/// perhaps with a fraction; a unit `b`, `k`, `m`, `g`, `t` or `p` in either
/// case, powers of 1024, or of 1000 with `b` after it (`kb`), or of 1024
/// with `ib` (`kib`); then perhaps `+1` or `-1`.
pub fn parse_file_size(s: &str) -> Result<u64, String> {
    rsync_size(s, 'b')
}

/// What one `--info=FLAGS` asks of rcp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Info {
    /// `name0` (false), `name1` or `name2` (true), where given.
    pub names: Option<bool>,
}

/// rsync's `--info` flags that rcp has (see [`CopyArgs::info`]).
pub fn parse_info(s: &str) -> Result<Info, String> {
    let mut info = Info { names: None };
    for flag in s.split(',') {
        match flag.to_ascii_lowercase().as_str() {
            "progress" | "progress0" | "progress1" | "progress2" => {}
            "name0" => info.names = Some(false),
            "name" | "name1" | "name2" => info.names = Some(true),
            _ => {
                return Err(format!(
                    "rcp takes --info=progress0/1/2 and name0/1/2 only, not {flag:?}"
                ));
            }
        }
    }
    Ok(info)
}

/// A rate as rsync reads `--bwlimit`: bytes a second in the units of
/// [`parse_file_size`], KiB where no unit is given; 0 for none.
pub fn parse_bwlimit(s: &str) -> Result<u64, String> {
    rsync_size(s, 'k')
}

/// A size in rsync's units, `default` where the number has none.
fn rsync_size(s: &str, default: char) -> Result<u64, String> {
    let bad = |why: &str| format!("{s:?}: {why} (sizes are as 1.5G, 500K, 500KB, 10M-1)");
    let (body, adjust) = match s.strip_suffix("+1").or(s.strip_suffix("-1")) {
        Some(body) if body.ends_with(|c: char| c.is_ascii_alphabetic()) => {
            (body, if s.ends_with("+1") { 1i128 } else { -1 })
        }
        _ => (s, 0),
    };
    let digits = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, unit) = body.split_at(digits);
    let number: f64 = match number.parse() {
        Ok(n) if !number.starts_with('.') => n,
        _ => return Err(bad("not a size")),
    };
    let unit = unit.to_ascii_lowercase();
    let (letter, base) = match unit.as_bytes() {
        [] => (default, 1024u128),
        [l] => (*l as char, 1024),
        [l, b'b'] => (*l as char, 1000),
        [l, b'i', b'b'] => (*l as char, 1024),
        _ => return Err(bad("an unknown unit")),
    };
    let power = match letter {
        'b' => 0,
        'k' => 1,
        'm' => 2,
        'g' => 3,
        't' => 4,
        'p' => 5,
        _ => return Err(bad("an unknown unit")),
    };
    if letter == 'b' && unit.len() > 1 {
        return Err(bad("an unknown unit"));
    }
    let bytes = (number * base.pow(power) as f64) as i128 + adjust;
    u64::try_from(bytes).map_err(|_| bad("out of range"))
}

/// A chunk size (`--chunk-size`): between 4K and 64M.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let n = rfabric::size::parse_size(s)?;
    if !(4096..=64 << 20).contains(&n) {
        return Err(format!("{s}: chunk size must be between 4K and 64M"));
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy_args(args: &[&str]) -> Result<CopyArgs, clap::Error> {
        let all = ["rcp"].iter().chain(args).chain(&["a", "b"]);
        parse_args(all).map(|cli| cli.copy)
    }

    /// The options an rsync user types out of habit parse to what rcp
    /// does: `-avhP --delete-after --info=progress2`, `-rlptgoD`, the
    /// `--no-` forms, `-W`, `-S`; `--info` flags rcp does not have are
    /// refused.
    #[test]
    fn rsync_habits_parse_to_what_rcp_does() {
        let a = copy_args(&["-avhP", "--delete-after", "--info=progress2"]).unwrap();
        assert!(a.archive && a.verbose() && a.partial_progress && a.delete);
        assert_eq!(a.preserve(), crate::archive::Preserve::BOTH);
        for delete in [
            "--delete-before",
            "--delete-during",
            "--delete-delay",
            "--del",
        ] {
            assert!(copy_args(&["-a", delete]).unwrap().delete, "{delete}");
        }
        let a = copy_args(&["-rlptgoD"]).unwrap();
        let archive = copy_args(&["-a"]).unwrap();
        assert_eq!(
            (a.recursive(), a.preserve(), a.keep()),
            (archive.recursive(), archive.preserve(), archive.keep())
        );
        let a = copy_args(&["-a", "--no-o", "--no-g", "--no-D", "--no-t"]).unwrap();
        let keep = a.keep();
        assert!(!keep.owner && !keep.group && !keep.devices);
        assert_eq!(
            a.preserve(),
            crate::archive::Preserve {
                modes: true,
                times: false
            }
        );
        // The last of a letter and its --no- form counts; -p gives modes
        // back after --no-p (and times, as scp's).
        assert!(copy_args(&["-a", "--no-o", "-o"]).unwrap().keep().owner);
        assert!(!copy_args(&["-o", "--no-o"]).unwrap().keep().owner);
        assert!(copy_args(&["-a", "--no-p", "-p"]).unwrap().preserve().modes);
        // A flag given again is taken, the last of each kind deciding;
        // -vv still counts.
        let again = copy_args(&["-t", "--no-t", "-t", "-q", "-q", "-vv"]).unwrap();
        assert!(again.preserve().times && again.quiet && again.verbose == 2);
        let both = crate::archive::Preserve::BOTH;
        let only = |modes, times| crate::archive::Preserve { modes, times };
        for (args, kept) in [
            (&["-rp", "--no-p"][..], only(false, true)),
            (&["-rp", "--no-t"][..], only(true, false)),
            (&["--no-t", "-rp"][..], both),
            (&["-rt", "--perms"][..], both),
            (&["-a", "--no-perms", "--perms"][..], both),
            (&["-r"][..], only(false, false)),
        ] {
            assert_eq!(copy_args(args).unwrap().preserve(), kept, "{args:?}");
        }
        assert!(!copy_args(&["-a", "--no-r"]).unwrap().recursive());
        // --usermap still keeps owners: it asks for them by name.
        assert!(
            copy_args(&["-a", "--no-o", "--usermap", "0:1"])
                .unwrap()
                .keep()
                .owner
        );
        let a = copy_args(&["-vW", "-S", "--info=name0"]).unwrap();
        assert!(a.whole_file && a.sparse && !a.verbose());
        assert!(copy_args(&["--info=progress2,name1"]).unwrap().verbose());
        let err = copy_args(&["--usermap", "0:1", "--usermap=2:3"]).unwrap_err();
        assert!(
            err.to_string().contains("--usermap may be given once"),
            "{err}"
        );
        let err = copy_args(&["--info=stats2"]).unwrap_err().to_string();
        assert!(err.contains("progress0/1/2 and name0/1/2"), "{err}");
    }

    #[test]
    fn file_sizes_read_as_rsync_reads_them() {
        for (text, bytes) in [
            ("0", 0),
            ("100", 100),
            ("100b", 100),
            ("500K", 500 << 10),
            ("500k", 500 << 10),
            ("500KiB", 500 << 10),
            ("500KB", 500_000),
            ("1.5M", 3 << 19),
            ("1.5mb", 1_500_000),
            ("2G", 2 << 30),
            ("1T", 1 << 40),
            ("1P", 1 << 50),
            ("10M-1", (10 << 20) - 1),
            ("1k+1", 1025),
        ] {
            assert_eq!(parse_file_size(text), Ok(bytes), "{text}");
        }
        // --bwlimit's numbers are KiB.
        for (text, rate) in [
            ("0", 0),
            ("500", 500 << 10),
            ("1.5M", 3 << 19),
            ("10MB", 10_000_000),
        ] {
            assert_eq!(parse_bwlimit(text), Ok(rate), "{text}");
        }
        for bad in [
            "", "M", "1.5x", "-5", "1 M", ".5K", "1kbb", "1bb", "5-1", "1e3",
        ] {
            let e = parse_file_size(bad).unwrap_err();
            assert!(e.contains("sizes are as"), "{bad}: {e}");
        }
    }
}
