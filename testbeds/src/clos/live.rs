//! The live analyzer in the Clos run: `analyze live` on the management network for the whole
//! timeline, each line it writes stamped with the testbed's clock as it arrives, so that a
//! finding's delay is measured from the fault's injection to the line's arrival, as an operator
//! would see it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;

use anyhow::Context;
use serde::Serialize;

use super::net::{MGMT, Plan};
use crate::harness::now_ns;
use crate::score::Finding;

/// The analyzer's port on the management network.
pub const PORT: u16 = 18_620;

/// A running analyzer and the thread reading its lines.
#[derive(Debug)]
pub struct Analyzer {
    child: Child,
    reader: Option<JoinHandle<Vec<(u64, String)>>>,
}

/// `analyze live` in the management namespace, reading pushes of `window_s` summaries; with
/// `switches` (the Prometheus that scrapes the switches, and the seconds before a finding its
/// counters' usual rate is taken from) it asks about each finding's switch ports.
pub fn start(
    bin: &Path,
    plan: &Plan,
    inventory: &Path,
    window_s: u64,
    log: &Path,
    switches: Option<(&str, u64)>,
) -> anyhow::Result<Analyzer> {
    let log = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let listen = format!("{}:{PORT}", Plan::collector_ip());
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &plan.ns(MGMT)])
        .arg(bin.join("analyze"))
        .args(["live", "--listen", &listen, "--window-s", &window_s.to_string(), "--inventory"])
        .arg(inventory);
    if let Some((url, before_s)) = switches {
        // The switches are scraped every second: a sample past a span's end exists 3 s after it.
        cmd.args(["--prometheus", url, "--counters-lookback-s", "3", "--counters-before-s", &before_s.to_string()]);
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(log).spawn().context("starting analyze live")?;
    let stdout = child.stdout.take().context("analyze live's stdout")?;
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout).lines().map_while(Result::ok).map(|l| (now_ns(), l)).collect()
    });
    Ok(Analyzer { child, reader: Some(reader) })
}

impl Analyzer {
    /// Stops it; every line it wrote, with its arrival time.
    pub fn stop(mut self) -> Vec<(u64, String)> {
        self.kill();
        self.reader.take().and_then(|r| r.join().ok()).unwrap_or_default()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Analyzer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A finding as the live lines tell it: opened (and when the line arrived), closed or not.
#[derive(Debug, Clone, Serialize)]
pub struct LiveFinding {
    pub kind: String,
    pub entity: String,
    pub start_ns: u64,
    pub end_ns: Option<u64>,
    /// When its `open` line arrived (testbed clock).
    pub opened_at_ns: u64,
}

/// The findings of the `open` and `close` lines, and the windows' delays after their end (ms).
pub fn findings(lines: &[(u64, String)]) -> (Vec<LiveFinding>, Vec<u64>) {
    let mut out: Vec<LiveFinding> = Vec::new();
    let mut delays = Vec::new();
    for (at, line) in lines {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        match v["event"].as_str() {
            Some("open") => out.push(LiveFinding {
                kind: s("kind"),
                entity: s("entity"),
                start_ns: v["window_start_ns"].as_u64().unwrap_or(0),
                end_ns: None,
                opened_at_ns: *at,
            }),
            Some("close") => {
                if let Some(f) = out.iter_mut().rev().find(|f| f.kind == s("kind") && f.entity == s("entity")) {
                    f.end_ns = v["end_ns"].as_u64();
                }
            }
            Some("window") => delays.extend(v["after_end_ms"].as_u64()),
            _ => {}
        }
    }
    (out, delays)
}

impl LiveFinding {
    pub fn scored(&self) -> Finding {
        Finding { kind: self.kind.clone(), entity: self.entity.clone(), start_ns: self.start_ns, end_ns: self.end_ns }
    }
}

/// What the live analyzer said of the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LiveResult {
    pub findings: Vec<LiveFinding>,
    /// Per fault with an expected finding: (fault kind, target, ms from injection to the first
    /// `open` line naming it, if one came).
    pub delays_ms: Vec<(String, String, Option<u64>)>,
    /// How long after their end the windows were localised, ms: median and largest.
    pub window_after_end_ms: (u64, u64),
    pub lines: usize,
}

/// The median of `v` (the lower middle), or 0.
pub fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}
