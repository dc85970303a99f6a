//! Several agents, each a separate process, probing each other on loopback.

mod common;

use std::time::Duration;

use common::*;
use rocemesh_formats::record::{Arrived, Outcome};

fn clean_run(net: u8, mode: &str, agents: usize, event_coalesce_us: u64) {
    let root = tempfile::tempdir().expect("tempdir");
    let configs: Vec<_> = (0..agents).map(|i| setup(root.path(), net, i, agents, 20.0, mode, "")).collect();
    for c in &configs {
        let text = std::fs::read_to_string(c).expect("config");
        let line = format!("mode = \"{mode}\"\n");
        assert!(text.contains(&line), "{text}");
        let text = text.replace(&line, &format!("{line}event_coalesce_us = {event_coalesce_us}\n"));
        std::fs::write(c, text).expect("config");
    }
    let children: Vec<_> = configs.iter().map(|c| spawn(c, 4)).collect();
    for (i, c) in children.into_iter().enumerate() {
        let (code, err) = finish(c);
        assert_eq!(code, 0, "agent {i}:\n{err}");
    }
    for i in 0..agents {
        let mut recs = records(root.path(), i);
        drop_startup_refusals(&mut recs, i, (0..agents).filter(|&j| j != i));
        let t = tally(&recs);
        assert_eq!(t.len(), agents - 1, "agent {i} has records for every target: {t:?}");
        for (target, (ok, lost, invalid)) in &t {
            assert!(*ok >= 50, "agent {i} → {target}: only {ok} ok probes in 4 s at 20/s");
            assert_eq!((*lost, *invalid), (0, 0), "agent {i} → {target}: a clean loopback run loses nothing");
        }
        for (_, r) in &recs {
            assert_eq!(r.arrived, Arrived::ALL.0);
            assert!(r.network_rtt_ns >= 0 && r.network_rtt_ns < 50_000_000, "loopback RTT {} ns", r.network_rtt_ns);
            assert!(r.responder_delay_ns >= 0 && r.prober_delay_ns >= 0);
            assert_ne!(r.responder_epoch, 0);
        }
    }
}

#[test]
fn three_agents_event_mode_clean_run_loses_nothing() {
    clean_run(31, "event", 3, 0);
}

#[test]
fn three_agents_event_mode_with_interrupt_moderation_lose_nothing() {
    clean_run(40, "event", 3, 1000);
}

#[test]
fn two_agents_busy_poll_clean_run_loses_nothing() {
    clean_run(32, "busy_poll", 2, 0);
}

/// A responder that ignores 20% of probes: the probers' loss toward it is 20% within
/// statistics, and nothing else loses.
#[test]
fn injected_loss_is_measured_within_statistics() {
    let root = tempfile::tempdir().expect("tempdir");
    let n = 3;
    let configs: Vec<_> = (0..n)
        .map(|i| {
            let extra = if i == 0 { "ignore_probe_fraction = 0.2\n" } else { "" };
            setup(root.path(), 33, i, n, 100.0, "event", extra)
        })
        .collect();
    let children: Vec<_> = configs.iter().map(|c| spawn(c, 5)).collect();
    for c in children {
        assert_eq!(finish(c).0, 0);
    }
    let (mut ok, mut lost) = (0u64, 0u64);
    for i in 1..n {
        let mut recs = records(root.path(), i);
        drop_startup_refusals(&mut recs, i, (0..n).filter(|&j| j != i));
        let t = tally(&recs);
        let (o, l, inv) = t[&name(0)];
        assert_eq!(inv, 0);
        ok += o;
        lost += l;
        for (target, (_, l, _)) in t.iter().filter(|(k, _)| **k != name(0)) {
            assert_eq!(*l, 0, "agent {i} → {target} must not lose");
        }
    }
    let total = (ok + lost) as f64;
    assert!(total > 500.0, "{total} probes");
    let p = lost as f64 / total;
    let sigma = (0.2 * 0.8 / total).sqrt();
    assert!(
        (p - 0.2).abs() < 4.0 * sigma,
        "measured loss {p:.4} vs injected 0.2 (4σ = {:.4}, n = {total})",
        4.0 * sigma
    );
    // A probe whose responder ignored it saw no ACK at all.
    let recs = records(root.path(), 1);
    assert!(
        recs.iter()
            .filter(|(t, r)| *t == name(0) && r.outcome == Outcome::Lost as u8)
            .all(|(_, r)| r.arrived == Arrived::PROBE_SENT)
    );
}

/// kill -9 of one agent mid-run: its peers record its probes as lost and keep running; when it
/// comes back (new epoch) records resume, and its crashed segment is recovered and sealed.
#[test]
fn a_killed_peer_is_lost_then_resumes() {
    let root = tempfile::tempdir().expect("tempdir");
    let n = 3;
    let configs: Vec<_> = (0..n).map(|i| setup(root.path(), 34, i, n, 20.0, "event", "")).collect();
    let survivors: Vec<_> = configs[..2].iter().map(|c| spawn(c, 9)).collect();
    let mut victim = spawn(&configs[2], 60);
    std::thread::sleep(Duration::from_secs(3));
    victim.kill().expect("kill -9");
    let _ = victim.wait();
    std::thread::sleep(Duration::from_secs(2));
    // Back for longer than the survivors run, so that the last word about it is "up".
    let back = spawn(&configs[2], 6);
    for c in survivors {
        let (code, err) = finish(c);
        assert_eq!(code, 0, "a survivor must keep running:\n{err}");
    }
    let (code, err) = finish(back);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("sealing a segment left open by a previous run"), "{err}");

    let recs = records(root.path(), 0);
    let to_victim: Vec<_> = recs.iter().filter(|(t, _)| *t == name(2)).map(|(_, r)| *r).collect();
    // On UDP the dead agent's host answers "port unreachable": those probes are recorded as
    // refused (peer down) rather than lost; some in flight at the kill are plain lost.
    let down =
        to_victim.iter().filter(|r| r.outcome == Outcome::Refused as u8 || r.outcome == Outcome::Lost as u8).count();
    assert!((20..=60).contains(&down), "about 2 s at 20/s unanswered while the peer was dead: {down}");
    assert!(to_victim.iter().any(|r| r.outcome == Outcome::Refused as u8), "the kernel's refusals were seen");
    let epochs: std::collections::BTreeSet<u32> =
        to_victim.iter().filter(|r| r.outcome == Outcome::Ok as u8).map(|r| r.responder_epoch).collect();
    assert_eq!(epochs.len(), 2, "answers before the kill and after the restart, from two epochs: {epochs:?}");
    let last_ok = to_victim.iter().filter(|r| r.outcome == Outcome::Ok as u8).map(|r| r.t1_unix_ns).max().expect("ok");
    let last_lost = to_victim
        .iter()
        .filter(|r| r.outcome == Outcome::Refused as u8 || r.outcome == Outcome::Lost as u8)
        .map(|r| r.t1_unix_ns)
        .max()
        .expect("unanswered");
    assert!(last_ok > last_lost, "probing resumed after the peer came back");
    // The victim's records from before the kill survived in its recovered segment.
    assert!(records(root.path(), 2).len() > 40);
}

/// Garbage and forged datagrams at the responder port: counted, ignored, no panic, no loss.
#[test]
fn forged_and_garbage_datagrams_are_counted_and_ignored() {
    let root = tempfile::tempdir().expect("tempdir");
    let configs: Vec<_> = (0..2).map(|i| setup(root.path(), 35, i, 2, 20.0, "event", "")).collect();
    let children: Vec<_> = configs.iter().map(|c| spawn(c, 4)).collect();
    std::thread::sleep(Duration::from_secs(1));
    let s = std::net::UdpSocket::bind((addr(35, 9), 0)).expect("bind");
    let target = (addr(35, 0), PORT);
    let mut garbage = 0;
    for len in [0usize, 1, 63, 64, 65, 500, 1400] {
        s.send_to(&vec![0xA5; len], target).expect("send");
        garbage += 1;
    }
    // Our magic and version with a wrong checksum, and a bad kind with a good checksum.
    let mut forged = [0u8; 64];
    forged[0..4].copy_from_slice(b"RMPB");
    forged[4] = 1;
    forged[5] = 2;
    s.send_to(&forged, target).expect("send");
    forged[5] = 9;
    let crc = crc32c::crc32c(&forged[..60]);
    forged[60..].copy_from_slice(&crc.to_le_bytes());
    s.send_to(&forged, target).expect("send");
    garbage += 2;
    // A well-formed ACK1 for a sequence number nobody sent.
    let mut ack = [0u8; 64];
    rocemesh_agent::protocol::Packet {
        kind: rocemesh_agent::protocol::Kind::Ack1,
        seq: 0x1234_5678_0000_0001,
        flow_label: 1,
        responder_epoch: 1,
        t3_ns: 1,
        t4_ns: 1,
    }
    .encode(&mut ack);
    s.send_to(&ack, target).expect("send");
    let mut errs = Vec::new();
    for c in children {
        let (code, err) = finish(c);
        assert_eq!(code, 0, "{err}");
        errs.push(err);
    }
    assert_eq!(final_stat(&errs[0], "malformed"), garbage);
    assert_eq!(final_stat(&errs[0], "unknown"), 1);
    assert_eq!(final_stat(&errs[0], "lost"), 0);
    assert_eq!(tally(&records(root.path(), 0))[&name(1)].1, 0);
    assert_eq!(final_stat(&errs[1], "lost"), 0);
}

/// A new pinglist is picked up without a restart; a broken one is reported with file and line
/// and the previous stays in force.
#[test]
fn pinglist_reload_without_restart_and_bad_files_keep_the_previous() {
    let root = tempfile::tempdir().expect("tempdir");
    let configs: Vec<_> = (0..3).map(|i| setup(root.path(), 36, i, 3, 20.0, "event", "")).collect();
    let dir0 = configs[0].parent().expect("dir").to_path_buf();
    write_pinglist(&dir0, 36, 0, [1].into_iter(), 20.0, 1);
    let children: Vec<_> = configs.iter().map(|c| spawn(c, 6)).collect();
    std::thread::sleep(Duration::from_millis(1500));
    let tmp = dir0.join("pinglist.toml.tmp");
    std::fs::write(
        &tmp,
        "version = 1\nhost = \"h0\"\ngeneration = 2\ngenerated_unix_ns = 0\n[[target]]\nfrom = \"lo\"\nrate_pps = -1\n",
    )
    .expect("write");
    std::fs::rename(&tmp, dir0.join("pinglist.toml")).expect("rename");
    std::thread::sleep(Duration::from_millis(1500));
    write_pinglist(&dir0, 36, 0, [1, 2].into_iter(), 20.0, 3);
    let mut errs = Vec::new();
    for c in children {
        let (code, err) = finish(c);
        assert_eq!(code, 0, "{err}");
        errs.push(err);
    }
    assert!(errs[0].contains("pinglist not reloaded") && errs[0].contains("pinglist.toml:"), "{}", errs[0]);
    assert!(errs[0].contains("generation=3"), "{}", errs[0]);
    let recs = records(root.path(), 0);
    let t = tally(&recs);
    assert_eq!(t[&name(1)].1, 0, "probing h1 went on through both reloads without loss");
    let first_to_2 =
        recs.iter().filter(|(t, _)| *t == name(2)).map(|(_, r)| r.t1_unix_ns).min().expect("h2 probed after reload");
    let first_to_1 = recs.iter().filter(|(t, _)| *t == name(1)).map(|(_, r)| r.t1_unix_ns).min().expect("h1");
    assert!(first_to_2 > first_to_1 + 2_500_000_000, "h2 only after the third file");
}

#[test]
fn a_low_memlock_limit_is_refused_with_the_limit_named() {
    let root = tempfile::tempdir().expect("tempdir");
    let config = setup(root.path(), 37, 0, 1, 10.0, "event", "");
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "ulimit -l 64 && exec {} run --config {} --duration-s 1",
            env!("CARGO_BIN_EXE_agent"),
            config.display()
        ))
        .output()
        .expect("bash");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("RLIMIT_MEMLOCK is 64 KiB") && err.contains("LimitMEMLOCK"), "{err}");
}

/// `agent run --config agent.toml` from the config's own directory (a relative path with no
/// directory part, as a new user copies the demo's): the pinglist's directory is watched as
/// `.`, the agent probes and exits 0. It had exited 2 with "watching  failed" (an empty path).
#[test]
fn a_config_named_without_a_directory_runs_from_its_own_directory() {
    let root = tempfile::tempdir().expect("tempdir");
    let config = setup(root.path(), 46, 0, 2, 10.0, "event", "");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent"))
        .current_dir(config.parent().expect("dir"))
        .args(["run", "--config", "agent.toml", "--duration-s", "1"])
        .env("RUST_LOG", "info")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(root.path().join("h0/segments/lo").is_dir(), "segments under the config's directory: {err}");
}

#[test]
fn check_config_reports_shards_and_targets() {
    let root = tempfile::tempdir().expect("tempdir");
    let config = setup(root.path(), 38, 0, 3, 10.0, "event", "");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("2 targets, 20.0 probes/s"), "{text}");
    std::fs::write(config.parent().expect("dir").join("pinglist.toml"), "version = 7\n").expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("version 7"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// SIGTERM: the agent drains, seals every segment and exits 0.
#[test]
fn sigterm_seals_segments_and_exits_cleanly() {
    let root = tempfile::tempdir().expect("tempdir");
    let configs: Vec<_> = (0..2).map(|i| setup(root.path(), 39, i, 2, 20.0, "event", "")).collect();
    let children: Vec<_> = configs.iter().map(|c| spawn(c, 600)).collect();
    std::thread::sleep(Duration::from_secs(2));
    for c in &children {
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        assert_eq!(unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) }, 0);
    }
    for c in children {
        let (code, err) = finish(c);
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("final_=true"), "{err}");
    }
    for i in 0..2 {
        let dir = root.path().join(format!("h{i}/segments/lo"));
        let names: Vec<String> = std::fs::read_dir(&dir)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.is_empty() && names.iter().all(|n| n.ends_with(".rseg.zst")), "only sealed segments: {names:?}");
        assert!(records(root.path(), i).len() >= 30);
    }
}

/// A target the local stack refuses to send to (the IPv4 broadcast address without
/// SO_BROADCAST: EACCES before anything leaves the host) is this host's failure: its probes are
/// recorded as local drops, never as loss, counted per reason and logged once with the errno's
/// message. At f9b751e they were recorded `Lost`, and analysis blamed the network.
#[test]
fn probes_the_local_stack_refuses_are_local_drops_not_loss() {
    let root = tempfile::tempdir().expect("tempdir");
    let configs: Vec<_> = (0..2).map(|i| setup(root.path(), 47, i, 2, 20.0, "event", "")).collect();
    // Agent 0 also probes a target it cannot send to.
    let pl_path = root.path().join("h0/pinglist.toml");
    let mut pl = rocemesh_formats::pinglist::Pinglist::load(&pl_path).expect("pinglist");
    let mut unsendable = pl.targets[0].clone();
    unsendable.to = "hx/bcast".into();
    unsendable.addr = std::net::Ipv4Addr::BROADCAST.into();
    pl.targets.push(unsendable);
    std::fs::write(&pl_path, pl.to_toml_string().expect("toml")).expect("write");

    let children: Vec<_> = configs.iter().map(|c| spawn(c, 4)).collect();
    let mut outputs = Vec::new();
    for (i, c) in children.into_iter().enumerate() {
        let (code, err) = finish(c);
        assert_eq!(code, 0, "agent {i}:\n{err}");
        outputs.push(err);
    }
    let recs = records(root.path(), 0);
    let to_bcast: Vec<_> = recs.iter().filter(|(t, _)| t == "hx/bcast").map(|(_, r)| *r).collect();
    assert!(to_bcast.len() >= 50, "4 s at 20/s: {} records", to_bcast.len());
    for r in &to_bcast {
        assert_eq!(r.outcome, Outcome::LocalDrop as u8, "{r:?}");
        assert_eq!(r.arrived & Arrived::PROBE_SENT, 0, "it never left: {r:?}");
    }
    // The healthy peer is unaffected.
    let to_peer: Vec<_> = recs.iter().filter(|(t, _)| *t == name(1)).map(|(_, r)| *r).collect();
    assert!(to_peer.iter().filter(|r| r.outcome == Outcome::Ok as u8).count() >= 50);
    assert!(to_peer.iter().all(|r| r.outcome != Outcome::Lost as u8 && r.outcome != Outcome::LocalDrop as u8));
    let err = &outputs[0];
    assert_eq!(final_stat(err, "local_drops"), to_bcast.len() as u64, "{err}");
    assert_eq!(final_stat(err, "lost"), 0, "{err}");
    assert!(err.contains("local_drops_by_reason=send_error="), "{err}");
    // Logged with the kernel's reason, once (the rest are counted, not logged).
    let lines = err.lines().filter(|l| l.contains("probes stay local")).collect::<Vec<_>>();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("Permission denied"), "{}", lines[0]);
}

/// Segment writes that fail (here: a file-size limit below the segment size, so reserving a new
/// segment fails with EFBIG, as a full disk fails with ENOSPC) are counted, logged with the
/// writer's own message (path, reserve size, what to change) once per interval rather than per
/// record, and the agent keeps probing. At f9b751e the shard discarded the error (`let _`):
/// the records were dropped and the log said nothing.
#[test]
fn segment_write_errors_reach_the_log_once_and_the_agent_keeps_probing() {
    use std::os::unix::process::CommandExt;
    let root = tempfile::tempdir().expect("tempdir");
    let configs: Vec<_> = (0..2).map(|i| setup(root.path(), 48, i, 2, 50.0, "event", "")).collect();
    let mut limited = command(&configs[0], 4);
    // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
    unsafe {
        limited.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: 1 << 20, rlim_max: 1 << 20 };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &raw const lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let a = limited.spawn().expect("spawn the limited agent");
    let b = spawn(&configs[1], 4);
    let (code, err) = finish(a);
    let (code_b, err_b) = finish(b);
    assert_eq!(code_b, 0, "{err_b}");
    assert!(code == 0 || code == 1, "the limited agent ran to its end (exit {code}):\n{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("segment write failed")).collect();
    assert_eq!(lines.len(), 1, "logged once in 4 s, not per record: {lines:#?}");
    assert!(lines[0].contains("reserve") && lines[0].contains("LimitFSIZE"), "the writer's own words: {}", lines[0]);
    assert!(final_stat(&err, "write_errors") >= 2, "every failed write is counted:\n{err}");
    assert!(final_stat(&err, "records_dropped") > 0, "{err}");
    // It kept probing and answering: its peer saw no loss.
    assert!(final_stat(&err_b, "ok") >= 100, "{err_b}");
    assert_eq!(final_stat(&err_b, "lost"), 0, "{err_b}");
}

#[test]
fn service_tracing_without_the_kernel_hook_says_why_once_and_probing_goes_on() {
    // This host (and CI's) has BPF but no RDMA modules: the tracer cannot attach. Whatever the
    // reason here (no ib_core BTF as root, a missing capability otherwise), the agent must name
    // it once and probe its pinglist as if tracing were off.
    let root = tempfile::tempdir().expect("tempdir");
    let tracing = "\n[service_tracing]\nenabled = true\n";
    let configs: Vec<_> = (0..2).map(|i| setup(root.path(), 49, i, 2, 50.0, "event", tracing)).collect();
    let (a, b) = (spawn(&configs[0], 3), spawn(&configs[1], 3));
    let (code, err) = finish(a);
    let (code_b, err_b) = finish(b);
    assert_eq!((code, code_b), (0, 0), "{err}\n{err_b}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("service tracing is off")).collect();
    assert_eq!(lines.len(), 1, "said once: {lines:#?}");
    assert!(
        lines[0].contains("ib_core") || lines[0].contains("CAP_BPF"),
        "the reason names the missing module or capability: {}",
        lines[0]
    );
    assert!(final_stat(&err, "ok") >= 50, "{err}");
    assert_eq!(final_stat(&err, "lost"), 0, "{err}");
}
