//! The command line, as clap sees it: here in the library so that the man
//! page and the shell completions are generated from the same definitions
//! (`packaging/docgen`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use rfabric::endpoint::Transport;
use rfabric::link::seal::EncryptChoice;
use rfabric::storage::EngineChoice;

use crate::config::{FabricAddr, Listen, RemoteExport, TlsMode, ZeroCopy};
use crate::export::ExportSpec;

/// Export block devices and files over NBD and over RDMA: `rblock serve`
/// on the node with the storage, `rblock connect` on the node that uses
/// it (the kernel's NBD driver, qemu or libnbd's tools talk to it there).
#[derive(Parser, Debug)]
#[command(
    name = "rblock",
    version,
    after_long_help = "Exit status:\n  \
                       0  a clean stop (SIGTERM or SIGINT: requests in flight are answered, \
                       an attached device is detached first); rblock detach: detached, or \
                       nothing to do\n  \
                       1  anything else failed (named on stderr)\n  \
                       2  bad usage\n  \
                       3  refused: the server does not serve that export, or turned the \
                       connection down\n  \
                       5  a local I/O error: an export, socket or device that cannot be \
                       opened or used here\n  \
                       6  the server could not be reached (rblock connect)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Serve exports over NBD (TCP or a unix socket) and, with --listen,
    /// to `rblock connect` over RDMA or tcp; until SIGTERM.
    #[command(after_help = THREADS_HELP)]
    Serve(ServeArgs),
    /// Reach an export of a remote `rblock serve` over RDMA (or tcp) and
    /// offer it to local NBD clients; with --device, attach it as a kernel
    /// block device. Until SIGTERM (which detaches the device first).
    #[command(after_help = THREADS_HELP)]
    Connect(ConnectArgs),
    /// Detach a kernel NBD device (/dev/nbdX) if it is attached: what an
    /// `rblock connect --device` that was killed (and could not detach)
    /// left behind. Nothing to do is not an error.
    Detach(DetachArgs),
}

/// The environment variable that chooses the runtime (see
/// [`crate::app::runtime`]).
const THREADS_HELP: &str = "\
Environment:
  RBLOCK_THREADS=1  run the shared runtime on one thread (connect does by
                    default: a request crosses the gateway without waking
                    another thread); any other value gives it a thread per
                    core (serve does by default). serve also runs a
                    runtime of one thread per core, for tcp fabric links
                    and NBD connections busy with small requests.";

#[derive(Args, Debug)]
pub struct DetachArgs {
    /// The device, /dev/nbdX.
    #[arg(value_name = "DEVICE")]
    pub device: PathBuf,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// An export: NAME=PATH, or NAME=PATH,ro for read-only. PATH is a
    /// regular file or a block device; its size is the export's size.
    /// ,secret-file=FILE gives it a fabric secret of its own (rblock
    /// connect must prove it to open this export; NBD clients on
    /// --nbd-listen are not asked). Repeat for more; the first one is also
    /// the default export (the empty name).
    #[arg(
        long = "export",
        required = true,
        value_name = "NAME=PATH[,ro][,secret-file=FILE]"
    )]
    pub exports: Vec<ExportSpec>,
    /// Where NBD clients connect: ADDR:PORT or unix:PATH. Repeat for more.
    #[arg(
        long = "nbd-listen",
        value_name = "ADDR:PORT|unix:PATH",
        default_value = "127.0.0.1:10809"
    )]
    pub listen: Vec<Listen>,
    /// Also serve `rblock connect` clients here (RDMA through rdma_cm
    /// and tcp on the same port, see --transport). Port 10810 if left
    /// out.
    #[arg(long = "listen", value_name = "ADDR[:PORT]")]
    pub fabric: Option<FabricAddr>,
    /// The shared secret every `rblock connect` must prove it knows before
    /// any export is opened (challenge-response: the secret never crosses
    /// the wire). The file holds at least 16 bytes and is readable by its
    /// owner only; give clients the same file. Required for --listen on
    /// an address other than loopback, unless --no-auth or every export
    /// has a secret-file= of its own (which then wins for that export).
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Serve --listen without a secret on an address other than loopback:
    /// anyone who reaches it can read and write every export. Says so
    /// when it starts.
    #[arg(long, conflicts_with = "secret_file")]
    pub no_auth: bool,
    /// Which fabric sessions must be encrypted (AES-256-GCM with keys
    /// only the two ends hold): tcp ones, all of them (always), or none
    /// the client does not ask for (never). Every message and data piece
    /// of an authenticated session is authenticated in any case; without
    /// a secret nothing is sealed.
    #[arg(long, value_enum, default_value_t = EncryptChoice::Tcp, value_name = "WHEN")]
    pub encrypt: EncryptChoice,
    /// What --listen offers: rdma and tcp where an RDMA device has the
    /// address (auto), or only one of them.
    #[arg(long, value_enum, default_value_t = Transport::Auto)]
    pub transport: Transport,
    /// Connections served at once; more are refused.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Large reads (64 KiB and more) whose data is all in the page cache
    /// are sent straight from it (sendfile), never copied by the server.
    /// auto (the default) and always: for every plain client, across the
    /// network or on this machine; never: the server copies every read.
    /// Under TLS reads are always copied (the server encrypts them).
    #[arg(long, value_enum, default_value_t = ZeroCopy::Auto)]
    pub zero_copy_reads: ZeroCopy,
    /// Serve each NBD connection to a local export (plain or TLS) on N threads
    /// of its own that wait on the socket in turn, as nbdkit does, while it
    /// is quiet: a lone request is answered on the client's core, at once,
    /// and large writes overlap on several cores. A connection that keeps
    /// many small requests (up to 64 KiB) in flight moves to a runtime
    /// thread of its own, which serves it with fewer wake-ups; one that
    /// keeps larger ones in flight, or reads more than 256 KiB at a time,
    /// moves to the shared runtime, whose threads serve its reads on
    /// several cores at once. Either way it comes back once it is quiet
    /// again. 0: serve every connection on the shared runtime.
    #[arg(long, default_value_t = 16, value_name = "N",
          value_parser = clap::value_parser!(u16).range(0..=64))]
    pub nbd_threads: u16,
    /// Seconds a stop (SIGTERM, SIGINT) gives connections to finish the
    /// requests they have taken; then they are closed and the server
    /// exits, even if a client reads none of its replies. Keep it below
    /// systemd's TimeoutStopSec.
    #[arg(long, default_value_t = 30, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub stop_grace: u64,
    /// TLS for NBD clients (NBD_OPT_STARTTLS): off; on (clients may start
    /// it); require (nothing is served before it: a plain client is told
    /// NBD_REP_ERR_TLS_REQD). Needs --tls-certificates or --tls-psk. Reads
    /// are then copied and encrypted here, never sent from the cache.
    #[arg(long, value_enum, default_value_t = TlsMode::Off, value_name = "MODE")]
    pub tls: TlsMode,
    /// X.509 credentials: a directory with server-cert.pem and
    /// server-key.pem (the layout nbdkit and qemu use).
    #[arg(long, value_name = "DIR", conflicts_with = "tls_psk")]
    pub tls_certificates: Option<PathBuf>,
    /// Pre-shared keys: psktool's file of username:hexkey lines.
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
    /// Storage engine for the exports: auto uses io_uring where the kernel
    /// allows it (not on RHEL 8 or 9.0-9.2, refused by default on 9.3+
    /// and 10) and a pool of threads elsewhere, saying so once; io_uring
    /// insists on it (an error where refused).
    #[arg(long, value_enum, default_value_t = EngineChoice::Auto, value_name = "ENGINE")]
    pub io_engine: EngineChoice,
}

#[derive(Args, Debug)]
pub struct ConnectArgs {
    /// The export: HOST[:PORT]/NAME (port 10810 if left out; an IPv6
    /// address in brackets).
    #[arg(value_name = "HOST[:PORT]/NAME")]
    pub target: RemoteExport,
    /// Where local NBD clients connect: ADDR:PORT or unix:PATH. Repeat for
    /// more. Default: 127.0.0.1:10809, or only a private unix socket when
    /// --device is given.
    #[arg(long = "nbd-listen", value_name = "ADDR:PORT|unix:PATH")]
    pub listen: Vec<Listen>,
    /// Attach the export as this kernel block device (/dev/nbdX), one
    /// kernel connection per lane, through the kernel's NBD netlink family
    /// (nbd.ko, Linux 4.12+; no nbd-client needed). A device already in
    /// use is an error. Without the family (after modprobe nbd), falls
    /// back to nbd-client. Needs root.
    #[arg(long, value_name = "/dev/nbdX")]
    pub device: Option<PathBuf>,
    /// Lanes to the server: one queue pair (or tcp connection) each. Local
    /// NBD connections take turns on them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub connections: u16,
    /// rdma when an RDMA device routes to the server, else tcp (auto); or
    /// only one of them.
    #[arg(long, value_enum, default_value_t = Transport::Auto)]
    pub transport: Transport,
    /// When the server cannot be reached (restarting, network down),
    /// requests wait this many seconds for it before they fail with an
    /// I/O error.
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub give_up_after: u64,
    /// The server's shared secret (the same file as its --secret-file).
    /// With it, a server that cannot prove it knows the secret is refused;
    /// without it, a server that asks for one refuses this client.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// When the fabric links are encrypted (AES-256-GCM): over tcp, which
    /// crosses ordinary networks, always (RDMA too), or never (unless the
    /// server requires it). Needs --secret-file: the keys come from it.
    #[arg(long, value_enum, default_value_t = EncryptChoice::Tcp, value_name = "WHEN")]
    pub encrypt: EncryptChoice,
    /// Local NBD connections served at once; more are refused.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
}
