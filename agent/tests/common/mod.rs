//! Agents as separate processes on loopback, and what they wrote.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rocemesh_formats::pinglist::{Pinglist, ProbeKind, Target};
use rocemesh_formats::record::{Outcome, ProbeRecord};
use rocemesh_formats::segment::SegmentReader;

pub const PORT: u16 = 18600;

/// Address of agent `i` in test network `net` (each test its own /24 of 127.0.0.0/8).
pub fn addr(net: u8, i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, net, 10 + i as u8))
}

pub fn name(i: usize) -> String {
    format!("h{i}/lo")
}

/// Write agent `i`'s config and pinglist (probe every other of `n` agents at `rate_pps`).
pub fn setup(root: &Path, net: u8, i: usize, n: usize, rate_pps: f64, mode: &str, extra_shard: &str) -> PathBuf {
    let dir = root.join(format!("h{i}"));
    std::fs::create_dir_all(&dir).expect("mkdir");
    write_pinglist(&dir, net, i, (0..n).filter(|&j| j != i), rate_pps, 1);
    let cfg = format!(
        "host = \"h{i}\"\npinglist = \"pinglist.toml\"\nsegment_dir = \"segments\"\nmode = \"{mode}\"\n\
         flush_interval_ms = 100\nstats_interval_s = 0\n\n[[shard]]\ndevice = \"lo\"\ntor = \"tor0\"\n\
         bind = \"{}:{PORT}\"\ncore = {}\n{extra_shard}",
        addr(net, i),
        i % std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1)
    );
    let path = dir.join("agent.toml");
    std::fs::write(&path, cfg).expect("config");
    path
}

pub fn write_pinglist(
    dir: &Path,
    net: u8,
    i: usize,
    targets: impl Iterator<Item = usize>,
    rate_pps: f64,
    generation: u64,
) {
    let pl = Pinglist {
        version: 1,
        host: format!("h{i}"),
        generation,
        generated_unix_ns: 0,
        timeout_ms: 300,
        targets: targets
            .map(|j| Target {
                from: "lo".into(),
                to: name(j),
                tor: String::new(),
                kind: ProbeKind::TorMesh,
                addr: addr(net, j),
                port: Some(PORT),
                qpn: None,
                rate_pps,
                flow_labels: vec![1, 2, 3],
            })
            .collect(),
    };
    // Written beside and renamed into place, as ctl does, so the agent never reads half a file.
    let tmp = dir.join("pinglist.toml.tmp");
    std::fs::write(&tmp, pl.to_toml_string().expect("toml")).expect("write");
    std::fs::rename(&tmp, dir.join("pinglist.toml")).expect("rename");
}

pub fn spawn(config: &Path, duration_s: u64) -> Child {
    command(config, duration_s).spawn().expect("spawn agent")
}

/// The agent's command line and environment, for tests that change the process further.
pub fn command(config: &Path, duration_s: u64) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_agent"));
    c.args(["run", "--config"])
        .arg(config)
        .args(["--duration-s", &duration_s.to_string()])
        .env("RUST_LOG", "info")
        // Some tests make one agent a lossy peer (ignore_probe_fraction), a hook production
        // configs refuse.
        .env("ROCEMESH_TEST_HOOKS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// Wait for an agent; its exit code and stderr.
pub fn finish(child: Child) -> (i32, String) {
    let out = child.wait_with_output().expect("wait");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Wait for every agent: their stderr, each having exited 0.
pub fn finish_all(children: Vec<Child>) -> Vec<String> {
    children
        .into_iter()
        .map(|c| {
            let (code, err) = finish(c);
            assert_eq!(code, 0, "{err}");
            err
        })
        .collect()
}

/// Agents 0 and 1, probing each other, lost nothing: none in their final stats, none in their
/// records, and each recorded more than `min_ok` ok probes to the other.
pub fn assert_pair_lossless(root: &Path, errs: &[String], min_ok: u64) {
    for (i, err) in errs.iter().enumerate() {
        assert_eq!(final_stat(err, "lost"), 0, "agent {i}:\n{err}");
        let (ok, lost, _) = tally(&records(root, i))[&name(1 - i)];
        assert!(ok > min_ok && lost == 0, "agent {i}: ok {ok}, lost {lost}");
    }
}

/// A counter from the agent's final stats line.
pub fn final_stat(stderr: &str, key: &str) -> u64 {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.contains("shard stats") && l.contains("final_=true"))
        .unwrap_or_else(|| panic!("no final stats in:\n{stderr}"));
    let pat = format!(" {key}=");
    let at = line.find(&pat).unwrap_or_else(|| panic!("no {key} in {line}")) + pat.len();
    line[at..].split(|c: char| !c.is_ascii_digit()).next().and_then(|v| v.parse().ok()).expect("number")
}

/// Every record agent `i` wrote, with the name of its target.
pub fn records(root: &Path, i: usize) -> Vec<(String, ProbeRecord)> {
    let dir = root.join(format!("h{i}/segments/lo"));
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let r = SegmentReader::open(&f).unwrap_or_else(|e| panic!("{e}"));
        assert!(r.damage().is_empty(), "{}: {:?}", f.display(), r.damage());
        let names: HashMap<u32, String> = r.dictionary().iter().map(|e| (e.id, e.name.clone())).collect();
        for c in r.probe_chunks() {
            for k in 0..c.len() {
                let rec = c.row(k);
                out.push((names[&rec.target].clone(), rec));
            }
        }
    }
    out
}

/// (ok, lost, invalid or refused) per target.
pub fn tally(recs: &[(String, ProbeRecord)]) -> HashMap<String, (u64, u64, u64)> {
    let mut m: HashMap<String, (u64, u64, u64)> = HashMap::new();
    for (t, r) in recs {
        let e = m.entry(t.clone()).or_default();
        match Outcome::from_u8(r.outcome) {
            Some(Outcome::Ok) => e.0 += 1,
            Some(Outcome::Lost) => e.1 += 1,
            _ => e.2 += 1,
        }
    }
    m
}

/// Agents start as separate processes: a probe sent before its peer's process was up is
/// recorded as refused (peer down), never as loss. Check that refusals happen only before the
/// peer's first answer, then drop them.
pub fn drop_startup_refusals(recs: &mut Vec<(String, ProbeRecord)>, prober: usize, peers: impl Iterator<Item = usize>) {
    for j in peers {
        let first_ok = recs
            .iter()
            .filter(|(t, r)| *t == name(j) && r.outcome == Outcome::Ok as u8)
            .map(|(_, r)| r.t1_unix_ns)
            .min()
            .unwrap_or_else(|| panic!("agent {prober} → {}: no answer at all", name(j)));
        assert!(
            recs.iter()
                .filter(|(t, r)| *t == name(j) && r.outcome == Outcome::Refused as u8)
                .all(|(_, r)| r.t1_unix_ns < first_ok),
            "agent {prober} → {}: refused after the peer was up",
            name(j)
        );
    }
    recs.retain(|(_, r)| r.outcome != Outcome::Refused as u8);
}

/// GET `path` from `addr` (HTTP/1.0: no chunking); the body.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(std::io::Error::other(format!("GET {path}: {head}")));
    }
    Ok(body.to_owned())
}
