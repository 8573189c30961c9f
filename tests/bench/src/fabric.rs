//! A link pushing chunks through a full credit window, against a baseline
//! run side by side in the same run.
//!
//! * `--transport tcp` (the default): the tcp backend on 127.0.0.1 against
//!   iperf3 single-stream on the same machine.
//! * `--transport rdma` / `rdma-send`: the verbs backend (write-with-imm, or
//!   the write-then-send fallback) on `--addr`; the RDMA baseline
//!   (ib_write_bw) is run next to it by `tests/bench/vm-rdma` in the VM.
//!
//! The figure that matters is the ratio: absolute numbers on a shared
//! 2-core machine (or an emulated VM) say little.

use rfabric::size::parse_size;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use rfabric::link::{ChunkMeta, Incoming, Link, LinkConfig};
use rfabric::memory::BufferPool;
use rfabric::transport::Connection;
use rfabric::transport::tcp::{self, TcpListener};
use rfabric::transport::verbs::{self, NotifyMode, VerbsListener, VerbsOptions};
use rfabric::wire::Role;

/// Push chunks through a link and compare with a baseline.
#[derive(Parser, Debug)]
struct Args {
    /// Backend: tcp, rdma (write with immediate) or rdma-send (write, then
    /// a send carrying the note).
    #[arg(long, default_value = "tcp")]
    transport: String,
    /// Address for the rdma backends (an IP of an RDMA device).
    #[arg(long, default_value = "10.77.0.1:7474")]
    addr: std::net::SocketAddr,
    /// Bytes to move in each measurement (suffixes: K, M, G).
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    bytes: u64,
    /// Chunk payload size.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    chunk: u64,
    /// Landing slots (the credit window).
    #[arg(long, default_value_t = 16)]
    window: u32,
    /// Sender buffers (registered pool) feeding the window.
    #[arg(long, default_value_t = 4)]
    buffers: usize,
    /// Rounds of each measurement; the medians are compared.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Skip the iperf3 baseline (always skipped for the rdma backends).
    #[arg(long)]
    no_iperf3: bool,
}

/// One run of the fabric: returns bytes per second.
async fn fabric_round(args: &Args) -> anyhow::Result<f64> {
    let chunk = u32::try_from(args.chunk).context("chunk too large")?;
    let (server, client) = connect_pair(args).await?;
    let (rx, tx) = tokio::join!(
        Link::establish(server, LinkConfig::new(Role::Server, args.window, chunk)),
        Link::establish(client, LinkConfig::new(Role::Client, 0, chunk)),
    );
    let (rx, tx) = (rx?, tx?);
    let pool = BufferPool::new(args.buffers, chunk as usize)?;
    let region = tx.register(pool.memory())?;
    let chunks = args.bytes.div_ceil(args.chunk);
    let start = Instant::now();
    let sender = tokio::spawn(async move {
        for i in 0..chunks {
            let mut buf = pool.acquire().await;
            buf.set_len(chunk as usize);
            let meta = ChunkMeta {
                offset: i * u64::from(chunk),
                ..ChunkMeta::default()
            };
            tx.send_chunk(meta, &region, buf).await?;
        }
        tx.finish().await?;
        anyhow::Ok(())
    });
    let mut received = 0u64;
    while let Some(item) = rx.recv().await? {
        if let Incoming::Chunk(c) = item {
            received += c.payload().len() as u64;
        }
    }
    rx.finish().await?;
    sender.await??;
    let secs = start.elapsed().as_secs_f64();
    if received != chunks * args.chunk {
        bail!(
            "received {received} bytes, expected {}",
            chunks * args.chunk
        );
    }
    Ok(received as f64 / secs)
}

/// A connected pair on the chosen backend.
async fn connect_pair(args: &Args) -> anyhow::Result<(Arc<dyn Connection>, Arc<dyn Connection>)> {
    let notify = match args.transport.as_str() {
        "tcp" => {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            let (server, client) = tokio::join!(listener.accept(), tcp::connect(addr));
            return Ok((Arc::new(server?), Arc::new(client?)));
        }
        "rdma" => NotifyMode::WriteWithImm,
        "rdma-send" => NotifyMode::WriteThenSend,
        other => bail!("unknown transport {other:?}: tcp, rdma or rdma-send"),
    };
    let options = VerbsOptions {
        notify,
        ..VerbsOptions::default()
    };
    let listener = VerbsListener::bind(args.addr, options)?;
    let (server, client) = tokio::join!(listener.accept(), verbs::connect(args.addr, options));
    let (server, client) = (server?, client?);
    Ok((Arc::new(server), Arc::new(client)))
}

/// One iperf3 single-stream run on loopback: bytes per second received.
fn iperf3_round(bytes: u64) -> anyhow::Result<f64> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut server = Command::new("iperf3")
        .args(["-s", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start iperf3 (is it installed? scripts/setup installs it)")?;
    let result = iperf3_client(port, bytes, &mut server);
    // The server keeps listening (no -1: that would count a failed or early
    // attempt as its one client); it is stopped here either way.
    let _ = server.kill();
    let _ = server.wait();
    result
}

fn iperf3_client(port: u16, bytes: u64, server: &mut std::process::Child) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline || server.try_wait()?.is_some() {
            bail!("iperf3 server did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = Command::new("iperf3")
        .args([
            "-c",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-n",
            &bytes.to_string(),
            "-J",
        ])
        .output()
        .context("cannot run iperf3 client")?;
    let json = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("iperf3 client failed: {json}");
    }
    // end.sum_received.bits_per_second, without a JSON dependency: the
    // last "bits_per_second" in the report belongs to sum_received.
    let at = json
        .rfind("\"bits_per_second\"")
        .context("iperf3 printed no bits_per_second")?;
    let rest = &json[at + "\"bits_per_second\"".len()..];
    let num: String = rest
        .trim_start_matches([':', ' ', '\t'])
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+'))
        .collect();
    Ok(num.parse::<f64>().context("bad iperf3 number")? / 8.0)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.transport != "tcp" {
        args.no_iperf3 = true;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let rate = |bps: f64| format!("{:.3} GB/s ({:.1} MB/s)", bps / 1e9, bps / 1e6);
    println!(
        "moving {} MiB per round, chunk {} KiB, window {} slots, {} sender buffers, median of {} rounds",
        args.bytes >> 20,
        args.chunk >> 10,
        args.window,
        args.buffers,
        args.rounds
    );
    let mut fabric = Vec::new();
    let mut iperf = Vec::new();
    // Interleave the two so that machine noise hits both alike.
    for round in 1..=args.rounds {
        let f = rt.block_on(fabric_round(&args))?;
        fabric.push(f);
        print!("round {round}: rfabric {} {}", args.transport, rate(f));
        if !args.no_iperf3 {
            let i = iperf3_round(args.bytes)?;
            iperf.push(i);
            print!(", iperf3 {}", rate(i));
        }
        println!();
    }
    let fabric = median(&mut fabric);
    println!(
        "rfabric {} backend: {} median",
        args.transport,
        rate(fabric)
    );
    if !args.no_iperf3 {
        let iperf = median(&mut iperf);
        println!("iperf3 single stream: {} median", rate(iperf));
        println!("ratio rfabric/iperf3: {:.2}", fabric / iperf);
    }
    Ok(())
}
