//! `ctl collect` against a real OpenSSH server on loopback and a real agent sealing segments
//! while the collection runs.
//!
//! Hosts (ssh aliases of one sshd, each with its own segment directory): host0 holds sealed
//! segments; host1 the same plus one damaged file; host2 runs a real agent (two loopback
//! shards, 1 s segments) that seals and keeps sealing during the first collection; host4 is
//! unreachable. Every sealed file must arrive once and verified, the damaged one set apart,
//! host4 reported; a second collection after the agent stopped fetches exactly what was
//! sealed since, a third nothing; `--remove` deletes only verified files on the hosts.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::start_sshd;
use rocemesh_formats::record::{EndpointRole, ProbeRecord};
use rocemesh_formats::segment::{SegmentReader, SegmentWriter, WriterConfig, WriterIdentity, seal};

fn ctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ctl")).args(args).output().expect("run ctl")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// `n` sealed segments of 1,000 records in `dir/lo0`; their paths.
fn sealed_segments(dir: &Path, host: &str, n: usize) -> Vec<PathBuf> {
    let mut wc = WriterConfig::new(dir.join("lo0"));
    wc.segment_bytes = 4 << 20;
    let identity = WriterIdentity {
        host: host.into(),
        device: "lo0".into(),
        tor: "tor0".into(),
        agent_epoch: 7,
        tool: "collect test".into(),
    };
    let mut out = Vec::new();
    let mut w = SegmentWriter::new(wc, identity).expect("writer");
    let me = w.endpoint(EndpointRole::Rnic, &format!("{host}/lo0"), "tor0", [0; 16]);
    for s in 0..n {
        for i in 0..1_000u64 {
            let t = 1_795_500_000_000_000_000 + (s as u64 * 1_000 + i) * 1_000_000;
            w.append(&ProbeRecord { t1_unix_ns: t, seq: i + 1, prober: me, target: me, ..ProbeRecord::default() })
                .expect("append");
        }
        w.flush().expect("flush");
        w.rotate_if_older(u64::MAX).expect("rotate");
        for p in w.take_closed() {
            out.push(seal(&p, 3).expect("seal").sealed_path);
        }
    }
    for p in w.finish().expect("finish") {
        out.push(seal(&p, 3).expect("seal").sealed_path);
    }
    out
}

/// Sealed files under `dir`, as `<shard>/<file>`.
fn sealed_under(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for shard in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(shard.path()).into_iter().flatten().flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if name.ends_with(".rseg.zst") {
                out.insert(format!("{}/{name}", shard.file_name().to_string_lossy()));
            }
        }
    }
    out
}

/// Every file of `host` in the collection (any date), as `<shard>/<file>`, each verified; and
/// every path, to find duplicates and leftovers.
fn collected(out: &Path, host: &str) -> (BTreeSet<String>, Vec<PathBuf>) {
    let (mut names, mut paths) = (BTreeSet::new(), Vec::new());
    for date in std::fs::read_dir(out).expect("collection").flatten() {
        if date.file_name() == "damaged" {
            continue;
        }
        let h = date.path().join(host);
        for shard in std::fs::read_dir(&h).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(shard.path()).expect("shard").flatten() {
                let name = f.file_name().to_string_lossy().into_owned();
                assert!(!name.ends_with(".part"), "a partial file was left: {}", f.path().display());
                let r = SegmentReader::open(f.path()).unwrap_or_else(|e| panic!("{e}"));
                assert!(r.is_sealed() && r.damage().is_empty(), "{}", f.path().display());
                assert!(
                    names.insert(format!("{}/{name}", shard.file_name().to_string_lossy())),
                    "{name} collected twice"
                );
                paths.push(f.path());
            }
        }
    }
    (names, paths)
}

/// The number before `what` in the summary line.
fn summary_number(out: &str, what: &str) -> u64 {
    let line = out.lines().rev().find(|l| l.starts_with("hosts:")).unwrap_or_else(|| panic!("no summary in\n{out}"));
    let at = line.find(what).unwrap_or_else(|| panic!("no `{what}` in\n{out}"));
    line[..at].split_whitespace().last().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{what} in\n{out}"))
}

#[test]
fn collect_fetches_every_sealed_file_once_verified_and_sets_damage_apart() {
    let f = start_sshd();
    let root = f.path("hosts");
    let seg = |h: &str| root.join(h).join("segments");
    sealed_segments(&seg("host0"), "host0", 3);
    let host1 = sealed_segments(&seg("host1"), "host1", 3);
    // Damage the middle of host1's second file: zstd or a chunk checksum refuses it.
    let victim = &host1[1];
    let mut bytes = std::fs::read(victim).expect("read");
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 64] {
        *b ^= 0x5a;
    }
    std::fs::write(victim, bytes).expect("damage");
    let victim_rel = format!("lo0/{}", victim.file_name().expect("name").to_string_lossy());

    // host2: a real agent, 1 s segments, for 8 s.
    let agent_dir = root.join("host2");
    std::fs::create_dir_all(&agent_dir).expect("mkdir");
    let config = rocemesh_agent::demo::write(&agent_dir, 2, common::free_port(), false).expect("demo config");
    let text_cfg = std::fs::read_to_string(&config).expect("config").replace(
        "flush_interval_ms = 200\n",
        "flush_interval_ms = 200\nsegment_max_age_s = 1\npath_tracing = { enabled = false }\n",
    );
    std::fs::write(&config, text_cfg).expect("config");
    let cfg = rocemesh_agent::config::AgentConfig::load(&config).expect("agent config");
    let agent = std::thread::spawn(move || rocemesh_agent::runtime::run(&cfg, Some(Duration::from_secs(8))));
    std::thread::sleep(Duration::from_secs(3));
    assert!(!sealed_under(&seg("host2")).is_empty(), "the agent sealed nothing in 3 s");

    let out = f.path("collection");
    let remote = format!("{}/{{host}}/segments", root.display());
    let ssh_option = f.ssh_option();
    let collect = |extra: &[&str]| {
        let mut args = vec![
            "collect",
            "--hosts",
            "host0,host1,host2,host4",
            "--remote-dir",
            &remote,
            "--out",
            out.to_str().expect("utf-8"),
            "--ssh-option",
            &ssh_option,
            "--connect-timeout-s",
            "5",
        ];
        args.extend_from_slice(extra);
        ctl(&args)
    };
    let first = collect(&[]);
    let first_text = text(&first);
    let during = sealed_under(&seg("host2"));
    assert_eq!(first.status.code(), Some(1), "unreachable and damaged are problems:\n{first_text}");
    assert!(first_text.contains("host4:"), "the unreachable host is named:\n{first_text}");
    assert!(first_text.contains(&format!("damaged, set apart: {victim_rel}")), "{first_text}");
    assert!(f.path("collection/damaged/host1").join(&victim_rel).exists(), "the damaged file is kept apart");
    assert_eq!(summary_number(&first_text, "damaged,"), 1, "{first_text}");

    let agent_reports = agent.join().expect("agent thread").expect("agent run");
    assert_eq!(agent_reports.len(), 2, "both shards ran");
    let after = sealed_under(&seg("host2"));
    assert!(after.len() > during.len(), "the agent sealed more after the first collection");

    // Second run: exactly the files sealed since; third: nothing.
    let second = collect(&[]);
    let second_text = text(&second);
    let (got2, _) = collected(&out, "host2");
    assert_eq!(got2, after, "every sealed file of the agent's host, once:\n{second_text}");
    let fetched_second = summary_number(&second_text, "fetched");
    assert!(
        fetched_second as usize >= after.len() - during.len() && fetched_second as usize <= after.len(),
        "the second run fetched {fetched_second}, {} were sealed after the first listing began:\n{second_text}",
        after.len() - during.len()
    );
    for h in ["host0", "host1"] {
        let mut on_host = sealed_under(&seg(h));
        if h == "host1" {
            on_host.remove(&victim_rel);
        }
        assert_eq!(collected(&out, h).0, on_host, "{h}");
    }
    let third = collect(&[]);
    let third_text = text(&third);
    assert_eq!(summary_number(&third_text, "fetched"), 0, "nothing new:\n{third_text}");
    assert_eq!(summary_number(&third_text, "damaged,"), 1, "the damaged file is still reported:\n{third_text}");

    // --remove: verified files go from the hosts, the damaged one stays.
    let removing = collect(&["--remove"]);
    let removing_text = text(&removing);
    assert!(sealed_under(&seg("host0")).is_empty(), "{removing_text}");
    assert!(sealed_under(&seg("host2")).is_empty(), "{removing_text}");
    assert_eq!(sealed_under(&seg("host1")), BTreeSet::from([victim_rel.clone()]), "{removing_text}");
    assert_eq!(collected(&out, "host2").0, after, "removal left the collection whole");
    println!(
        "first run:\n{first_text}second run:\n{second_text}third run:\n{third_text}with --remove:\n{removing_text}"
    );
}
