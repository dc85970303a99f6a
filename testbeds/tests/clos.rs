//! `testbeds clos` end to end (issue 15): the Clos fabric of network namespaces, real UDP
//! agents, the fault timeline, `analyze localize` scored against it, and (when the agent traces
//! paths) the traces checked against the kernel's ECMP choice. Needs root: `scripts/test` runs
//! it when it is root (`cargo test --workspace -- --ignored`). About 4 minutes.
//!
//! The agent, ctl and analyze binaries are built here into the target directory `testbeds` is
//! in (a no-op when `cargo test --workspace` has just built them). Results stay in
//! `$CARGO_TARGET_TMPDIR/clos` (result.json, localize.json, agents/*.log, segments/).
//!
//! Also here: `ctl inventory lldp` on the real LLDP tables of a small Clos fabric wired wrong
//! on purpose (swapped uplinks, a host on another ToR), against its cabling plan.

use std::path::{Path, PathBuf};
use std::process::Command;

use rocemesh_formats::inventory::Inventory;
use rocemesh_testbeds::clos::lldp;
use rocemesh_testbeds::clos::net::{Fabric, Plan};

/// Held by each test for its whole run: `testbeds clos` removes at start every `rmc<pid>`
/// fabric whose maker is not a running `testbeds`, which a fabric this test process made is.
static ONE_FABRIC: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_fabric() -> std::sync::MutexGuard<'static, ()> {
    ONE_FABRIC.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_testbeds")).parent().expect("testbeds is in a directory").to_path_buf()
}

/// Builds the binaries `testbeds clos` runs, in the profile and target directory of `testbeds`.
fn build_binaries(bin: &Path) {
    let target_dir = bin.parent().expect("the profile directory is in the target directory");
    let profile = bin.file_name().and_then(|p| p.to_str()).expect("a profile directory name");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-p", "rocemesh-agent", "-p", "rocemesh-ctl", "-p", "rocemesh-analyze"])
        .arg("--target-dir")
        .arg(target_dir);
    if profile != "debug" {
        cmd.args(["--profile", profile]);
    }
    // Without the variables cargo sets for this test: build scripts that track one (ring's
    // tracks CARGO_MANIFEST_DIR) would otherwise rerun, and rebuild polars for analyze, every
    // time the test and a plain `cargo build` take turns.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        let injected = ["CARGO_PKG_", "CARGO_BIN_"].iter().any(|p| k.starts_with(p))
            || ["CARGO_MANIFEST_DIR", "CARGO_MANIFEST_PATH", "CARGO_CRATE_NAME", "CARGO_PRIMARY_PACKAGE"]
                .contains(&k.as_ref())
            || ["CARGO_TARGET_TMPDIR", "CARGO_RUSTC_CURRENT_DIR"].contains(&k.as_ref());
        if injected {
            cmd.env_remove(k.as_ref());
        }
    }
    // The run-time directory: a test binary built from the same sources in another checkout
    // (one shared target directory) is reused, and its compile-time path is that checkout's.
    let here = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    let status = cmd.current_dir(here).status().expect("running cargo build");
    assert!(status.success(), "building agent, ctl and analyze failed ({status})");
}

#[test]
#[ignore = "needs root (network namespaces, nftables): cargo test -p rocemesh-testbeds --test clos -- --ignored, as root"]
fn clos_fabric_localises_every_fault_and_blames_nothing_else() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "testbeds clos builds network namespaces and nftables rules and needs root: run this test as root \
         (scripts/test does when it is root); it cannot pass, or be skipped silently, as an ordinary user"
    );
    let _one = one_fabric();
    let bin = bin_dir();
    build_binaries(&bin);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("clos");
    let run = Command::new(env!("CARGO_BIN_EXE_testbeds"))
        .arg("clos")
        .arg("--out")
        .arg(&out)
        .arg("--bin")
        .arg(&bin)
        .output()
        .expect("running testbeds clos");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert_eq!(
        run.status.code(),
        Some(0),
        "testbeds clos failed ({}); the checks marked FAIL above say what, and {} has the logs",
        run.status,
        out.display()
    );
    // With path traces every fault is named; without, link and spine faults cannot be (2 spines).
    // Localised from the records and from the window summaries: both scores.
    if stdout.contains("path tracing on") {
        assert_eq!(stdout.matches("precision 1.000").count(), 2, "{stdout}");
        assert_eq!(stdout.matches("recall 1.000").count(), 2, "{stdout}");
    }
    // Nothing of the fabric is left behind.
    let prefix = format!("{}-", run_fabric(&out));
    let netns = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    let left: Vec<String> = String::from_utf8_lossy(&netns.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_string)
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

/// The run's fabric name (`rmc<pid>`, the prefix of its namespaces), from its result. A result
/// without it fails the test: an empty prefix would match no namespace and pass the check.
fn run_fabric(out: &Path) -> String {
    let path = out.join("result.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; testbeds clos writes it on every run", path.display()));
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
    match v["fabric"].as_str() {
        Some(f) if f.starts_with("rmc") && f.len() > 3 => f.to_owned(),
        _ => panic!("{}: no `fabric` name (rmc<pid>) in it", path.display()),
    }
}

#[test]
#[ignore = "needs root (network namespaces, lldpd): cargo test -p rocemesh-testbeds --test clos -- --ignored, as root"]
fn lldp_names_each_cable_of_a_miswired_fabric() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(root, "this test builds network namespaces and needs root; it cannot pass as an ordinary user");
    let _one = one_fabric();
    let bin = bin_dir();
    build_binaries(&bin);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("lldp-miswired");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    // This process's fabric (rmc<pid of this test>): `testbeds clos` above runs as its own process.
    let plan = Plan::for_this_process(2, 2, 2).unwrap();
    let inventory = out.join("inventory.toml");
    let planned = lldp::planned_cabling(&plan).unwrap();
    std::fs::write(&inventory, planned.to_toml_string().unwrap()).unwrap();
    let fabric = Fabric::up(plan.clone()).unwrap();
    let mut nodes = lldp::nodes(&plan);
    lldp::miswire(&fabric, &mut nodes).unwrap();
    let mut daemons = lldp::start(&plan, &nodes, &out.join("lldp")).unwrap();
    daemons.collect(&nodes, &out.join("lldp")).unwrap();
    drop(daemons);
    drop(fabric);
    let (code, said) = lldp::learn(&bin.join("ctl"), &inventory, &out.join("lldp")).unwrap();
    println!("{said}");
    assert_eq!(code, Some(1), "{said}");
    for expect in [
        "tor0.json:",
        "link tor0|spine1 is on tor0 port s0, but",
        "link tor0|spine0 is on tor0 port s1, but",
        "RNIC tor1-h0/rnic0 is cabled to tor0 port h9, but",
    ] {
        assert!(said.contains(expect), "{expect:?} not said:\n{said}");
    }
    let problems: Vec<&str> = said.lines().filter(|l| l.contains(" (fix: ")).collect();
    assert!(problems.iter().all(|l| l.contains(".json:")), "{problems:#?}");
    // What disagrees is left as planned.
    let after = Inventory::load(&inventory).unwrap();
    assert_eq!(after.links, planned.links);
    assert_eq!(after.hosts, planned.hosts);
}
