//! One source to many nodes: `rcp big.sif 'node[01-16]:/scratch/'`.
//!
//! The nodes form a chain in the order named ([`crate::chain`]): the
//! source sends each chunk once, to the first node, and each node passes
//! it on to the next as it writes it, so the whole takes about one copy's
//! time plus a chunk's per node (the model in `docs/rcp.md`).
//!
//! A round: start `rcp server-once` on every node still to be served,
//! through `--rsh` and at most `--fanout-bootstrap` at once (each with
//! its own one-time token), or take the daemons of `rcp://` operands;
//! then run one chain over those that started. Every node answers how
//! its copy ended. A node that failed, or went silent, is cut out by the
//! node before it, and the nodes after it hear nothing more: they are
//! served again by the next round, as a chain of their own. Each round
//! settles at least one node, so there are at most as many rounds as
//! nodes; in the common case (nothing fails) there is one.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rfabric::endpoint;
use tokio::process::Child;

use crate::chain::lost_node;
use crate::cli::{CopyArgs, Launcher, Order};
use crate::exit::Exit;
use crate::proto::{Hop, NodeResult};
use crate::report::{Progress, Report};
use crate::session::{self, Params, Request, Target};
use crate::shell;

/// A broadcast's chunk size unless --chunk-size says otherwise. A node
/// hands a chunk on once all of it landed, so every hop adds about a
/// chunk's time on its link (and what queues before it) to the last
/// node's finish: measured over eight nodes at 400 Mbit/s, 4 MiB chunks
/// cost 280 ms a hop, 1 MiB 63 ms, 256 KiB 29 ms (`docs/rcp.md`).
pub const CHUNK: usize = 256 * 1024;

/// A command line a broadcast cannot run (exit status 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// How a broadcast reaches its nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// `rcp server-once` started through `--rsh` as `user@node` (or
    /// `node`).
    Shell { user: Option<String> },
    /// `rcp serve` on every node on `port`, all with the secret of
    /// `--secret-file`.
    Daemon { port: u16 },
}

/// What a broadcast copies, and where.
#[derive(Debug, Clone)]
pub struct Broadcast {
    pub sources: Vec<PathBuf>,
    /// The node names, in chain order.
    pub nodes: Vec<String>,
    pub via: Via,
    /// The destination path on every node.
    pub dest: Vec<u8>,
}

/// How long a node's `rcp server-once` may take to end once its round
/// is over (its session ended or failed): then it is stopped.
const REMOTE_END: Duration = Duration::from_secs(10);

/// A node ready for a round: where the node before it connects.
struct Started {
    node: usize,
    hop: Hop,
    /// The remote shell running `rcp server-once` there (or the one srun
    /// running it on every node of the round).
    child: Option<Child>,
    /// `child` is the srun of the whole round.
    for_all: bool,
    /// Where it is in the network, as Slurm says (`top.s1.n1`).
    topology: Option<String>,
}

/// Runs the broadcast to the end: every node has a result in the report
/// (`nodes`, in the order named); `failed` stays empty (each node's
/// failures are in its result).
pub async fn run(
    b: Broadcast,
    a: &CopyArgs,
    p: Params,
    progress: &Progress,
) -> anyhow::Result<Report> {
    if p.streams != 1 {
        return Err(Usage(
            "--streams does not apply to a broadcast: each hop of the chain is one link".into(),
        )
        .into());
    }
    if a.launcher == Launcher::Srun && b.via != (Via::Shell { user: None }) {
        let why = "--launcher srun starts nodes as this user, not through rcp:// or as user@node";
        return Err(Usage(why.into()).into());
    }
    if a.order == Order::Topology && a.launcher != Launcher::Srun {
        let why = "--order topology needs --launcher srun (each node's place in the \
                   network comes from Slurm, SLURM_TOPOLOGY_ADDR)";
        return Err(Usage(why.into()).into());
    }
    let secret = match b.via {
        Via::Daemon { .. } => {
            let file = a
                .secret_file
                .as_ref()
                .context("rcp:// operands need --secret-file (the daemons' shared secret)")?;
            Some(rfabric::auth::read_secret(file)?)
        }
        Via::Shell { .. } => None,
    };
    // A source that cannot be read is found before any node is started,
    // and the first round's walk runs while the nodes start (the
    // logins of a remote shell take longest); a later round walks again.
    let mut early = Some(session::walk_sources(&b.sources, &p)?);
    let started = Instant::now();
    let mut results: Vec<Option<NodeResult>> = vec![None; b.nodes.len()];
    let mut pending: Vec<usize> = (0..b.nodes.len()).collect();
    let mut report: Option<Report> = None;
    let mut rounds = Vec::new();
    while !pending.is_empty() {
        let mut chain = Vec::new();
        for (node, reached) in start(&b, &pending, a).await {
            match reached {
                Ok(s) => chain.push(s),
                Err(e) => {
                    let why = format!("cannot start rcp there: {e:#}");
                    results[node] = Some(lost_node(&b.nodes[node], why));
                }
            }
        }
        if a.order == Order::Topology {
            let keys: Vec<Option<&str>> = chain.iter().map(|s| s.topology.as_deref()).collect();
            let order = by_switch(&keys);
            let mut taken: Vec<Option<Started>> = chain.into_iter().map(Some).collect();
            chain = order
                .iter()
                .map(|&i| taken[i].take().expect("each once"))
                .collect();
        }
        rounds.push(chain.iter().map(|s| b.nodes[s.node].clone()).collect());
        let Some(head) = chain.first() else {
            break;
        };
        let head_secret = match &secret {
            Some(s) => s.clone(),
            None => head.hop.token.clone(),
        };
        // (The head's own token goes no further than the head.)
        let hops: Vec<Hop> = chain
            .iter()
            .enumerate()
            .map(|(i, s)| Hop {
                token: if i == 0 {
                    Vec::new()
                } else {
                    s.hop.token.clone()
                },
                ..s.hop.clone()
            })
            .collect();
        let round = async {
            let target = Target {
                addr: endpoint::resolve(&head.hop.host, head.hop.port)?,
                transport: a.tuning.transport,
            };
            let request = Request::Push {
                sources: b.sources.clone(),
                dest: b.dest.clone(),
                chain: Some(hops),
            };
            let early = early.take();
            session::client(target, &head_secret, request, p.clone(), progress, early).await
        };
        match round.await {
            Ok(r) => {
                for result in &r.nodes {
                    let here = chain.iter().find(|s| b.nodes[s.node] == result.name);
                    if let Some(s) = here {
                        results[s.node].get_or_insert_with(|| result.clone());
                    }
                }
                report = Some(merge(report, r));
            }
            // This side's own trouble (a source it cannot read) stops the
            // broadcast, as it would stop a copy: no node is to blame.
            Err(e) if matches!(Exit::of_error(&e), Exit::Io | Exit::Usage) => return Err(e),
            Err(e) => {
                let why = format!("{e:#}");
                results[head.node] = Some(lost_node(&b.nodes[head.node], why));
            }
        }
        // A node the round settled ends by itself; one it did not is
        // waiting for a link that will not come (it is started afresh).
        let all_settled = chain.iter().all(|s| results[s.node].is_some());
        for s in &mut chain {
            let settled = results[s.node].is_some() && (all_settled || !s.for_all);
            if let Some(child) = &mut s.child
                && (!settled
                    || tokio::time::timeout(REMOTE_END, child.wait())
                        .await
                        .is_err())
            {
                let _ = child.kill().await;
            }
        }
        let unsettled: Vec<usize> = chain
            .iter()
            .map(|s| s.node)
            .filter(|&n| results[n].is_none())
            .collect();
        // (A round that settled nobody would repeat for ever.)
        if unsettled.len() == chain.len() {
            for n in unsettled {
                let why = "the chain broke before it, and again when it was run alone".into();
                results[n] = Some(lost_node(&b.nodes[n], why));
            }
            break;
        }
        pending = unsettled;
    }
    let nodes: Vec<NodeResult> = results
        .into_iter()
        .zip(&b.nodes)
        .map(|(r, name)| r.unwrap_or_else(|| lost_node(name, "never reached".into())))
        .collect();
    let mut report = report.unwrap_or_else(|| Report::nothing(p.io_engine));
    report.seconds = started.elapsed().as_secs_f64();
    // (Each node's failures are its own, in `nodes`; what vanished from
    // the source is said once.)
    report.failed.retain(|f| !f.kind.is_failure());
    report.failed.sort_by(|a, b| a.path.cmp(&b.path));
    report.failed.dedup_by(|a, b| a.path == b.path);
    report.nodes = nodes;
    report.rounds = rounds;
    Ok(report)
}

/// The chain's order by network switch: the nodes under one switch (a
/// place `top.s1.n1` without its last part) next to one another, switches
/// in the order their first node is named, each switch's nodes in the
/// order named; a node with no place keeps its own, alone.
fn by_switch(places: &[Option<&str>]) -> Vec<usize> {
    fn switch(place: Option<&str>) -> Option<&str> {
        place.map(|p| p.rsplit_once('.').map_or(p, |(sw, _)| sw))
    }
    // Each switch's nodes, switches in the order of their first node; a
    // node without a place is a group of its own.
    let mut groups: Vec<(Option<&str>, Vec<usize>)> = Vec::new();
    for (i, place) in places.iter().enumerate() {
        let sw = switch(*place);
        match groups.iter_mut().find(|(g, _)| sw.is_some() && *g == sw) {
            Some((_, members)) => members.push(i),
            None => groups.push((sw, vec![i])),
        }
    }
    groups
        .into_iter()
        .flat_map(|(_, members)| members)
        .collect()
}

/// The rounds' reports as one: the bytes the source sent in all of them;
/// how the sessions ran, as the first said.
fn merge(so_far: Option<Report>, r: Report) -> Report {
    let Some(mut all) = so_far else {
        return r;
    };
    all.stats.bytes += r.stats.bytes;
    all.stats.failed |= r.stats.failed;
    all
}

/// Starts what serves `nodes` of `b`: `rcp server-once` through the
/// remote shell on each (at most `--fanout-bootstrap` starting at once),
/// or nothing for daemons. In the order of `nodes`.
async fn start(
    b: &Broadcast,
    nodes: &[usize],
    a: &CopyArgs,
) -> Vec<(usize, anyhow::Result<Started>)> {
    if a.launcher == Launcher::Srun {
        return srun(b, nodes, a).await;
    }
    let user = match &b.via {
        Via::Daemon { port } => {
            return nodes
                .iter()
                .map(|&node| {
                    let hop = Hop {
                        name: b.nodes[node].clone(),
                        host: b.nodes[node].clone(),
                        port: *port,
                        token: Vec::new(),
                    };
                    (
                        node,
                        Ok(Started {
                            node,
                            hop,
                            child: None,
                            for_all: false,
                            topology: None,
                        }),
                    )
                })
                .collect();
        }
        Via::Shell { user } => user.clone(),
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(a.fanout_bootstrap as usize));
    let starting: Vec<_> = nodes
        .iter()
        .map(|&node| {
            let host = b.nodes[node].clone();
            let login = match &user {
                Some(u) => format!("{u}@{host}"),
                None => host.clone(),
            };
            let (rsh, tuning, slots) = (a.rsh.clone(), a.tuning.clone(), Arc::clone(&slots));
            let task = tokio::spawn(async move {
                let _slot = slots.acquire_owned().await.expect("never closed");
                let shell::Remote { child, banner } =
                    shell::start(&rsh, &login, &tuning, 1).await?;
                anyhow::Ok(Started {
                    node,
                    hop: Hop {
                        name: host.clone(),
                        // (Where it says it listens, else its name.)
                        host: banner.addr.map_or(host, |a| a.to_string()),
                        port: banner.port,
                        token: banner.token,
                    },
                    child: Some(child),
                    for_all: false,
                    topology: None,
                })
            });
            (node, task)
        })
        .collect();
    let mut out = Vec::with_capacity(starting.len());
    for (node, task) in starting {
        let started = task
            .await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("internal error: {e}")));
        out.push((node, started));
    }
    out
}

/// How long the nodes under one srun have to print their banners.
const SRUN_START: Duration = Duration::from_secs(60);

/// Starts `rcp server-once` on `nodes` of `b` with one `srun` (one task
/// per node, `--label`led lines, each banner naming its Slurm node). The
/// srun runs until its last task ends: every node's `Started` holds it
/// through the first one (`child`), which the round waits for.
async fn srun(
    b: &Broadcast,
    nodes: &[usize],
    a: &CopyArgs,
) -> Vec<(usize, anyhow::Result<Started>)> {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let names: Vec<String> = nodes.iter().map(|&n| b.nodes[n].clone()).collect();
    let mut cmd = tokio::process::Command::new("srun");
    cmd.args([
        "--overlap",
        "--label",
        "--kill-on-bad-exit=0",
        "--ntasks-per-node=1",
    ])
    .arg(format!("--nodes={}", names.len()))
    .arg(format!("--nodelist={}", crate::hostlist::compress(&names)))
    .args(shell::server_once_args(&a.tuning, 1))
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::inherit())
    .kill_on_drop(true);
    let fail_all = |why: String| -> Vec<(usize, anyhow::Result<Started>)> {
        nodes
            .iter()
            .map(|&n| (n, Err(anyhow::anyhow!("{why}"))))
            .collect()
    };
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return fail_all(format!("cannot run srun: {e}")),
    };
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut found: Vec<Option<Started>> = (0..nodes.len()).map(|_| None).collect();
    let mut why_not = None;
    let reading = async {
        while found.iter().any(Option::is_none) {
            let Some(line) = lines.next_line().await? else {
                anyhow::bail!("srun ended before every node started rcp");
            };
            // `TASK: RCP-SERVER 1 PORT TOKEN ADDR NODE`
            let text = line.split_once(": ").map_or(line.as_str(), |(_, t)| t);
            let banner = shell::parse_banner(text)?;
            let (Some(node), Some(addr)) = (banner.node, banner.addr) else {
                anyhow::bail!("a node under srun did not say its name and address: {line:?}");
            };
            let Some(i) = names.iter().position(|n| *n == node) else {
                anyhow::bail!("srun started rcp on {node}, which the broadcast does not name");
            };
            found[i] = Some(Started {
                node: nodes[i],
                hop: Hop {
                    name: node,
                    host: addr.to_string(),
                    port: banner.port,
                    token: banner.token,
                },
                child: None,
                for_all: true,
                topology: banner.topology,
            });
        }
        anyhow::Ok(())
    };
    match tokio::time::timeout(SRUN_START, reading).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => why_not = Some(format!("{e:#}")),
        Err(_) => why_not = Some(format!("not started under srun within {SRUN_START:?}")),
    }
    // The srun's output goes on to nobody: its tasks say what they have
    // to say on stderr.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let mut child = Some(child);
    found
        .into_iter()
        .zip(nodes)
        .map(|(f, &n)| match f {
            Some(mut s) => {
                s.child = child.take();
                (n, Ok(s))
            }
            None => (
                n,
                Err(anyhow::anyhow!(
                    "{}",
                    why_not.clone().unwrap_or_else(|| "not started".into())
                )),
            ),
        })
        .collect()
}

/// The hosts of a `--hosts` file: one a line (each may be a host list),
/// blank lines and `#` comments skipped.
pub fn hosts_file(text: &str) -> anyhow::Result<Vec<String>> {
    let mut all = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let hosts = crate::hostlist::expand(line).with_context(|| format!("line {}", n + 1))?;
        all.extend(hosts);
    }
    if all.is_empty() {
        return Err(Usage("names no host".into()).into());
    }
    let joined = all.join(",");
    // (Refuses a host named twice across lines.)
    crate::hostlist::expand(&joined)?;
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topology_order_keeps_each_switch_together() {
        let places = [
            Some("top.s1.n1"),
            Some("top.s2.n2"),
            Some("top.s1.n3"),
            None,
            Some("top.s2.n4"),
            Some("top.s1.n5"),
            None,
        ];
        assert_eq!(by_switch(&places), [0, 2, 5, 1, 4, 3, 6]);
        // No places at all: the named order.
        assert_eq!(by_switch(&[None, None, None]), [0, 1, 2]);
        // A bare node name is its own switch.
        assert_eq!(by_switch(&[Some("a"), Some("b"), Some("a")]), [0, 2, 1]);
    }

    #[test]
    fn hosts_files_read_lists_and_refuse_a_host_twice() {
        let text = "# the rack\nn[1-3]\n\nlogin2  # and this\n";
        assert_eq!(hosts_file(text).unwrap(), ["n1", "n2", "n3", "login2"]);
        assert!(format!("{:#}", hosts_file("n[1-2]\nn2\n").unwrap_err()).contains("named twice"));
        assert!(hosts_file("# nothing\n").is_err());
        assert!(format!("{:#}", hosts_file("a\nn[2-1]\n").unwrap_err()).contains("line 2"));
    }
}
