//! `ctl push-pinglist`, `status` and `diff` against a real OpenSSH server on loopback.
//!
//! The test starts `/usr/sbin/sshd` as the current user with a throwaway host key and user key,
//! reaches it through an ssh config with five host aliases (host4 points at a closed port),
//! and runs the `ctl` binary the way an operator would.

mod common;

use common::{Fixture, start_sshd};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rocemesh_ctl::remote::Ssh;
use rocemesh_formats::pinglist::Pinglist;

fn ctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ctl")).args(args).output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Five hosts with 16 RNICs each under one ToR: ~1,200 targets, ~150 KB per pinglist, so that
/// a non-atomic write would be seen half-done by a reader.
fn write_inventory(path: &Path) {
    let mut inv = String::from("version = 1\n[[tor]]\nname = \"tor0\"\n[[tor]]\nname = \"tor1\"\n");
    for h in 0..5 {
        inv.push_str(&format!("[[host]]\nname = \"host{h}\"\n"));
        for k in 0..16 {
            inv.push_str(&format!(
                "[[host.rnic]]\ndevice = \"mlx5_{k}\"\ntor = \"tor{}\"\nip = \"10.{k}.0.{}\"\n",
                k % 2,
                h + 1
            ));
        }
    }
    std::fs::write(path, inv).unwrap();
}

fn generate(f: &Fixture, out: &str, generation: &str) {
    let inv = f.path("inventory.toml");
    let o = ctl(&[
        "gen-pinglists",
        "--inventory",
        inv.to_str().unwrap(),
        "--out",
        f.path(out).to_str().unwrap(),
        "--seed",
        "11",
        "--generation",
        generation,
        "--now-unix-ns",
        "1700000000000000000",
        "--probe-port",
        "18515",
    ]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn push_status_and_diff_over_real_ssh() {
    let f = start_sshd();
    write_inventory(&f.path("inventory.toml"));
    generate(&f, "gen1", "1");
    generate(&f, "gen2", "2");
    let remote = format!("{}/remote/{{host}}/etc/pinglist.toml", f.dir.path().display());
    let remote_of = |host: &str| PathBuf::from(remote.replace("{host}", host));
    let results = f.path("results.tsv");
    let ssh_option = f.ssh_option();
    let push = |from: &str, extra: &[&str]| {
        let from = f.path(from);
        let mut args = vec![
            "push-pinglist",
            "--from",
            from.to_str().unwrap(),
            "--remote-path",
            &remote,
            "--ssh-option",
            &ssh_option,
            "--connect-timeout-s",
            "5",
            "--results",
            results.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        ctl(&args)
    };

    // All five: host4's port is closed.
    let out = push("gen1", &["--parallel", "8"]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    for h in 0..4 {
        let host = format!("host{h}");
        let landed = std::fs::read(remote_of(&host)).unwrap_or_else(|e| panic!("{host}: {e}\n{report}"));
        assert_eq!(landed, std::fs::read(f.path("gen1").join(format!("{host}.toml"))).unwrap());
        assert!(report.lines().any(|l| l.starts_with(&host) && l.contains(" ok ")), "{report}");
    }
    assert!(!remote_of("host4").exists());
    let host4_line = report.lines().find(|l| l.starts_with("host4")).unwrap_or_else(|| panic!("{report}"));
    assert!(host4_line.contains("FAILED") && host4_line.contains("refused"), "{report}");
    assert!(report.contains("4 ok, 1 failed"), "{report}");
    assert_eq!(rocemesh_ctl::push::read_failed(&results).unwrap(), ["host4"]);

    // A reader racing repeated pushes of two generations never sees a partial file.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = Arc::clone(&stop);
        let path = remote_of("host0");
        std::thread::spawn(move || {
            let (mut reads, mut generations, mut bad) = (0u64, std::collections::BTreeSet::new(), Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match std::fs::read_to_string(&path) {
                    Ok(text) => match Pinglist::parse(&text, &path) {
                        Ok(p) => {
                            generations.insert(p.generation);
                        }
                        Err(e) => bad.push(format!("{} bytes: {e}", text.len())),
                    },
                    Err(e) => bad.push(format!("read failed: {e}")),
                }
                reads += 1;
            }
            (reads, generations, bad)
        })
    };
    for round in 0..12 {
        let from = if round % 2 == 0 { "gen2" } else { "gen1" };
        let out = push(from, &["--hosts", "host0,host1,host2,host3"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    stop.store(true, Ordering::Relaxed);
    let (reads, generations, bad) = reader.join().unwrap();
    assert!(
        bad.is_empty(),
        "{} of {reads} reads saw a partial or invalid file: {:?}",
        bad.len(),
        &bad[..bad.len().min(3)]
    );
    assert!(reads >= 100, "only {reads} reads raced the pushes");
    assert_eq!(generations.into_iter().collect::<Vec<_>>(), [1, 2]);
    for h in 0..4 {
        let dir = remote_of(&format!("host{h}")).parent().unwrap().to_path_buf();
        let names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["pinglist.toml"], "temporary files left in {}", dir.display());
    }

    // Fix host4 and retry only the failed host.
    f.write_ssh_config(f.port);
    let out = push("gen1", &["--retry-failed", results.to_str().unwrap()]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(report.contains("1 ok, 0 failed"), "{report}");
    assert!(!report.contains("host0"), "{report}");
    assert_eq!(std::fs::read(remote_of("host4")).unwrap(), std::fs::read(f.path("gen1").join("host4.toml")).unwrap());
    assert!(rocemesh_ctl::push::read_failed(&results).unwrap().is_empty());

    // status: host0..3 hold generation 1 (the last round), host4 too; against gen2 all are stale,
    // and a removed file is missing.
    std::fs::remove_file(remote_of("host3")).unwrap();
    let gen2 = f.path("gen2");
    let reach = ["--remote-path", remote.as_str(), "--ssh-option", ssh_option.as_str()];
    let mut args = vec!["status", "--from", gen2.to_str().unwrap()];
    args.extend_from_slice(&reach);
    let out = ctl(&args);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains("4 stale, 1 missing"), "{report}");
    let gen1 = f.path("gen1");
    let mut args = vec!["status", "--from", gen1.to_str().unwrap(), "--hosts", "host0,host4"];
    args.extend_from_slice(&reach);
    let out = ctl(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("2 current"), "{}", text(&out));

    // diff: what pushing gen2 would change on host0 and host3.
    let mut args = vec!["diff", "--from", gen2.to_str().unwrap(), "--against", "host0,host3"];
    args.extend_from_slice(&reach);
    let out = ctl(&args);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(report.contains("host0: generation 1 -> 2"), "{report}");
    assert!(report.contains("host3: generation - -> 2") && report.contains("no pinglist on the host yet"), "{report}");

    // The library's ssh runner: a large stdin arrives whole; a hung command is cut off.
    let ssh = Ssh {
        options: vec!["-F".into(), f.path("ssh_config").display().to_string()],
        timeout: Duration::from_secs(3),
        ..Ssh::default()
    };
    let big = vec![b'x'; 3 << 20];
    let out = ssh.run("host1", "wc -c", Some(&big)).unwrap();
    assert!(out.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), (3 << 20).to_string());
    let out = ssh.run("host1", "sleep 30", None).unwrap();
    assert!(out.timed_out && out.elapsed < Duration::from_secs(10), "{out:?}");
}

/// The fleet key file goes with the pinglists: beside each host's pinglist, readable only by its
/// owner and the group named by --key-group (never the directory's), never listed as a host; a key file others can read is
/// refused on the bastion and nothing is pushed.
#[test]
fn the_fleet_key_file_goes_with_the_pinglists_and_stays_private() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let f = start_sshd();
    write_inventory(&f.path("inventory.toml"));
    generate(&f, "gen1", "1");
    let gen1 = f.path("gen1");
    let out = ctl(&["keys", "rotate", "--from", gen1.to_str().unwrap(), "--grace-s", "0"]);
    assert!(out.status.success(), "{}", text(&out));
    let local_keys = gen1.join(rocemesh_formats::keys::FILE_NAME);
    let remote = format!("{}/remote/{{host}}/etc/pinglist.toml", f.dir.path().display());
    let keys_of = |host: &str| PathBuf::from(remote.replace("{host}", host)).with_file_name("fleet-keys.toml");
    let ssh_option = f.ssh_option();
    // The agent's group, named: here this user's own (the test cannot create `rocemesh`).
    let id_gn = std::process::Command::new("id").arg("-gn").output().unwrap();
    let group = String::from_utf8_lossy(&id_gn.stdout).trim().to_owned();
    let id_g = std::process::Command::new("id").arg("-g").output().unwrap();
    let gid: u32 = String::from_utf8_lossy(&id_g.stdout).trim().parse().unwrap();
    let push_as = |group: &str| {
        ctl(&[
            "push-pinglist",
            "--from",
            gen1.to_str().unwrap(),
            "--hosts",
            "host0,host1",
            "--remote-path",
            &remote,
            "--ssh-option",
            &ssh_option,
            "--results",
            f.path("results.tsv").to_str().unwrap(),
            "--key-group",
            group,
        ])
    };
    let push = || push_as(&group);
    // The target directories belong to another group where this user may set one (root): the
    // key file must not take theirs.
    for host in ["host0", "host1"] {
        let etc = keys_of(host).parent().unwrap().to_owned();
        std::fs::create_dir_all(&etc).unwrap();
        let _ = std::os::unix::fs::chown(&etc, None, Some(65534));
    }
    let out = push();
    let report = text(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(report.contains("2 ok, 0 failed") && !report.contains("fleet-keys"), "{report}");
    for host in ["host0", "host1"] {
        let path = keys_of(host);
        assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(&local_keys).unwrap(), "{host}");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o640, "{host}: private to its owner and the agent's group");
        assert_eq!(meta.gid(), gid, "{host}: the group named by --key-group, not the directory's");
        rocemesh_formats::keys::FleetKeys::load(&path).expect("the agent accepts it");
    }
    // A group the host lacks fails the push with the fix, leaving the installed file as it was.
    std::fs::remove_file(keys_of("host1")).unwrap();
    let out = push_as("no-such-group-rocemesh-test");
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let results = std::fs::read_to_string(f.path("results.tsv")).unwrap();
    assert!(results.contains("--key-group no-such-group-rocemesh-test not given"), "{report}\n{results}");
    assert!(!keys_of("host1").exists(), "no key file half installed");
    assert!(keys_of("host0").exists());
    let out = push();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // A key file others can read is refused before anything leaves the bastion.
    std::fs::set_permissions(&local_keys, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::remove_file(keys_of("host0")).unwrap();
    let out = push();
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains("local key file refused") && report.contains("chmod 600"), "{report}");
    assert!(!keys_of("host0").exists());
}
