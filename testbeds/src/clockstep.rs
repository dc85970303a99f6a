//! The soft-RoCE VM's clock-step check (issue 21's fault matrix): two agents probing each other
//! over UDP on the guest's loopback while CLOCK_REALTIME is stepped 20 s forward and then 20 s
//! back, as an operator's `date -s` or a PTP step would. A time namespace cannot do this (it
//! offsets only CLOCK_MONOTONIC and CLOCK_BOOTTIME), and stepping the CI host's own clock is not
//! something a test may do; the VM's clock is ours.
//!
//! Promised: the agents keep running and probing through both steps (a step back must not stop
//! the schedule until the clock catches up), no probe is recorded lost because of a step (the
//! ones in flight across it are recorded invalid), and each agent saw both steps. A probe a step
//! could cost was sent within a timeout before it or shortly after it: those are the ones judged.
//! Elsewhere a TCG guest's scheduling stalls and the agents' staggered start and exit lose a probe
//! now and then for reasons no step has a part in; every probe not ok is listed with where it
//! fell against the steps.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use crate::harness::{Check, read_records};

const AGENTS: usize = 2;
const PPS: f64 = 50.0;
const RUN_S: u64 = 16;
const STEP_S: i64 = 20;
const STEP_NS: u64 = STEP_S as u64 * 1_000_000_000;
const TIMEOUT_MS: u64 = 500;
/// How long around a step a probe is judged (beyond the timeout before it).
const NEAR_S: f64 = 1.0;
/// Segments go to the guest's tmpfs: an mmap'd segment over the 9p share stalls an agent
/// (see `rxelab::local_segments`).
const SEGMENTS: &str = "/tmp/rocemesh-clockstep";

fn step_realtime(by_s: i64) -> anyhow::Result<()> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime and clock_settime read and write the timespec we own.
    let r = unsafe {
        libc::clock_gettime(libc::CLOCK_REALTIME, &raw mut ts);
        ts.tv_sec += by_s as libc::time_t;
        libc::clock_settime(libc::CLOCK_REALTIME, &raw const ts)
    };
    if r != 0 {
        anyhow::bail!("clock_settime: {} (needs CAP_SYS_TIME: run in the VM as root)", std::io::Error::last_os_error());
    }
    Ok(())
}

fn write_agent(dir: &Path, i: usize) -> anyhow::Result<std::path::PathBuf> {
    let d = dir.join(format!("c{i}"));
    std::fs::create_dir_all(&d)?;
    let ip = |j: usize| format!("127.0.77.{}", 10 + j);
    let pl = rocemesh_formats::pinglist::Pinglist {
        version: 1,
        host: format!("c{i}"),
        generation: 1,
        generated_unix_ns: 0,
        timeout_ms: TIMEOUT_MS as u32,
        targets: (0..AGENTS)
            .filter(|&j| j != i)
            .map(|j| rocemesh_formats::pinglist::Target {
                from: "lo".into(),
                to: format!("c{j}/lo"),
                tor: "tor0".into(),
                kind: rocemesh_formats::pinglist::ProbeKind::TorMesh,
                addr: ip(j).parse().expect("literal"),
                port: Some(18800),
                qpn: None,
                rate_pps: PPS,
                flow_labels: vec![1, 2],
            })
            .collect(),
    };
    std::fs::write(d.join("pinglist.toml"), pl.to_toml_string()?)?;
    let cfg = d.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "host = \"c{i}\"\npinglist = \"pinglist.toml\"\nsegment_dir = \"{SEGMENTS}/c{i}\"\nstats_interval_s = 0\n\
             [path_tracing]\nenabled = false\n[[shard]]\ndevice = \"lo\"\ntor = \"tor0\"\nbind = \"{}:18800\"\ncore = {}\n",
            ip(i),
            i % 2
        ),
    )?;
    Ok(cfg)
}

/// Run the two agents through the steps; the checks, and the clock put back as it was.
pub fn run(agent: &Path, dir: &Path) -> anyhow::Result<Vec<Check>> {
    for d in [dir, Path::new(SEGMENTS)] {
        if d.exists() {
            std::fs::remove_dir_all(d)?;
        }
    }
    let mut children = Vec::new();
    for i in 0..AGENTS {
        let cfg = write_agent(dir, i)?;
        let log = std::fs::File::create(dir.join(format!("c{i}.log")))?;
        children.push(
            std::process::Command::new(agent)
                .args(["run", "--duration-s", &RUN_S.to_string(), "--config"])
                .arg(&cfg)
                .env("RUST_LOG", "info")
                .stdout(std::process::Stdio::from(log.try_clone()?))
                .stderr(std::process::Stdio::from(log))
                .spawn()
                .context("starting an agent")?,
        );
    }
    std::thread::sleep(Duration::from_secs(4));
    let forward_unix_ns = crate::harness::now_ns();
    step_realtime(STEP_S)?;
    std::thread::sleep(Duration::from_secs(4));
    step_realtime(-STEP_S)?;
    let back_unix_ns = crate::harness::now_ns();
    let when = Timeline { forward_unix_ns, back_unix_ns };
    let back = std::time::Instant::now();
    let mut exits = Vec::new();
    for mut c in children {
        exits.push(c.wait()?.code());
    }
    let after_back_s = back.elapsed().as_secs_f64();
    let mut checks = Vec::new();
    checks.push(Check {
        name: "clock step: agents ran through both steps".into(),
        ok: exits.iter().all(|c| *c == Some(0)),
        detail: format!("exit codes {exits:?}"),
    });
    let mut steps = Vec::new();
    for i in 0..AGENTS {
        let log = std::fs::read_to_string(dir.join(format!("c{i}.log")))?;
        steps.push(log.matches("CLOCK_REALTIME stepped").count());
    }
    checks.push(Check {
        name: "clock step: each agent saw both steps".into(),
        ok: steps.iter().all(|&n| n == 2),
        detail: format!("steps logged per agent {steps:?}"),
    });
    let mut records = Vec::new();
    for i in 0..AGENTS {
        records.extend(read_records(&Path::new(SEGMENTS).join(format!("c{i}")))?);
    }
    let count = |o: rocemesh_formats::record::Outcome| records.iter().filter(|r| r.outcome == o as u8).count();
    let (ok, lost, invalid) = (
        count(rocemesh_formats::record::Outcome::Ok),
        count(rocemesh_formats::record::Outcome::Lost),
        count(rocemesh_formats::record::Outcome::Invalid),
    );
    // The probes sent after the step back: their send times run from the clock just after it
    // to the agents' exit. By that clock, the probes before the steps were sent up to ~4 s
    // earlier and those between the steps 16 s later or more, so none falls in. A schedule stopped
    // by the step back (20 s, longer than the ~8 s left) would send none of them. Counted
    // whatever their outcome, and against the time the harness saw, so that an agent slow to
    // start (a loaded TCG guest) does not read as a stopped schedule.
    let span_ns = (after_back_s * 1e9) as u64;
    let since_back =
        records.iter().filter(|r| r.t1_ns + 100_000_000 >= back_unix_ns && r.t1_ns <= back_unix_ns + span_ns).count();
    // Less the drain (timeout + 50 ms) during which nothing new is sent.
    let expected = (AGENTS as f64 * PPS * (after_back_s - 0.55).max(0.0)) as usize;
    checks.push(Check {
        name: "clock step: probing went on through the step back".into(),
        ok: since_back >= expected * 8 / 10 && expected > 0,
        detail: format!(
            "{since_back} probes sent in the {after_back_s:.1} s after the step back, of about {expected}; \
             whole run: {} records ({ok} ok, {invalid} invalid, {lost} lost, {} other)",
            records.len(),
            records.len() - ok - invalid - lost
        ),
    });
    let judged = records.iter().filter(|r| when.near_a_step(r.t1_ns)).count();
    let (mut judged_lost, mut other_lost) = (0, 0);
    let mut not_ok = Vec::new();
    for r in records.iter().filter(|r| r.outcome != rocemesh_formats::record::Outcome::Ok as u8) {
        let near = when.near_a_step(r.t1_ns);
        if r.outcome == rocemesh_formats::record::Outcome::Lost as u8 {
            if near { judged_lost += 1 } else { other_lost += 1 }
        }
        let how = if near { "" } else { ", away from the steps" };
        not_ok.push(format!("{} {}->{} {}{how}", outcome_name(r.outcome), r.prober, r.target, when.place(r.t1_ns)));
    }
    // The spans around the two steps hold 2 x (timeout + 2 x NEAR_S) = 5 s of both agents'
    // probes (~500); two fifths of that at least, or the check judged too little to mean anything.
    let judged_expected = AGENTS as f64 * PPS * 2.0 * (TIMEOUT_MS as f64 / 1e3 + 2.0 * NEAR_S);
    let judged_min = (judged_expected * 2.0 / 5.0) as usize;
    checks.push(Check {
        name: "clock step: no probe recorded lost".into(),
        ok: judged_lost == 0 && judged >= judged_min,
        detail: format!(
            "{judged_lost} lost of {judged} sent near a step (within {:.1} s before one or {NEAR_S:.1} s after; \
             at least {judged_min} expected), {other_lost} lost away from the steps; {invalid} invalid \
             (in flight across a step); not ok: [{}]",
            NEAR_S + TIMEOUT_MS as f64 / 1e3,
            not_ok.join("; ")
        ),
    });
    Ok(checks)
}

fn outcome_name(o: u8) -> String {
    rocemesh_formats::record::Outcome::from_u8(o).map_or_else(|| format!("outcome {o}"), |o| format!("{o:?}"))
}

/// The wall clock's readings around the two steps, by the harness: where a record's send time
/// falls, said so that a failing check shows whether a step or something else cost the probe.
struct Timeline {
    forward_unix_ns: u64,
    back_unix_ns: u64,
}

impl Timeline {
    /// Whether a probe sent at `t1_ns` (by the clock of its frame) was sent within a timeout
    /// and `NEAR_S` before a step, or within `NEAR_S` after one: in flight across it, or sent
    /// by timers the step moved.
    fn near_a_step(&self, t1_ns: u64) -> bool {
        let (near_ns, timeout_ns) = ((NEAR_S * 1e9) as u64, TIMEOUT_MS * 1_000_000);
        // Each step's span, by the clock of each frame: from a timeout and NEAR_S before the
        // harness's reading, on through the instant it stepped (a probe the agent sent between the
        // harness's reading and clock_settime reads later than that reading; 10 ms covers it), and
        // from the clock it stepped to NEAR_S after it.
        let slack_ns = 10_000_000;
        let spans =
            [(self.forward_unix_ns, self.forward_unix_ns + STEP_NS), (self.back_unix_ns + STEP_NS, self.back_unix_ns)];
        spans.iter().any(|&(before, after)| {
            (before.saturating_sub(timeout_ns + near_ns)..=before + slack_ns).contains(&t1_ns)
                || (after.saturating_sub(slack_ns)..=after + near_ns).contains(&t1_ns)
        })
    }

    fn place(&self, t1_ns: u64) -> String {
        let ms = |a: u64, b: u64| (a as f64 - b as f64) / 1e6;
        // Between the steps the clock read 20 s ahead: later than anything the run reads after
        // the step back (it ends some 9 s after it), so that frame is told apart first.
        if t1_ns >= self.forward_unix_ns + STEP_NS {
            let (f, b) = (self.forward_unix_ns + STEP_NS, self.back_unix_ns + STEP_NS);
            format!(
                "sent between the steps, {:.0} ms after the step forward, {:.0} ms before the step back",
                ms(t1_ns, f),
                ms(b, t1_ns)
            )
        } else if t1_ns >= self.back_unix_ns {
            format!("sent {:.0} ms after the step back", ms(t1_ns, self.back_unix_ns))
        } else if t1_ns >= self.forward_unix_ns {
            "sent as the clock stepped forward".into()
        } else {
            format!("sent {:.0} ms before the step forward", ms(self.forward_unix_ns, t1_ns))
        }
    }
}
