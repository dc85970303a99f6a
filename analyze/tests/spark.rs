//! The SLA report as a Spark SQL job (analyze/spark/sla_report.py), run by pyspark in local mode
//! over `analyze export --partitioned`, checked row by row against `analyze report` on the same
//! segments (analyze/spark/compare.py: every count and quantile equal), in every scope, the
//! traced connections' `service` scope included.
//!
//! Needs a JRE and pyspark, so it is #[ignore]d in a plain `cargo test`; scripts/test installs
//! both (analyze/spark/setup) and runs it with ROCEMESH_SPARK_PYTHON set.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{NAMED_SERVICE, UNKNOWN_REMOTE, write_agents, write_agents_with_services};

/// The scopes both sides are asked for: every scope of the report.
const SCOPES: [&str; 6] = ["cluster", "tor_pair", "tor", "rnic", "pair", "service"];

/// Writes the agents' segments with `write`, exports them as a Hive dataset, reports them with
/// `analyze report` and with the Spark job in every scope of [`SCOPES`], and compares the two;
/// returns the directory holding it all, both reports and what compare.py said (it failed the
/// test if any row differs).
fn both_reports(write: fn(&Path) -> Vec<Vec<PathBuf>>) -> (tempfile::TempDir, PathBuf, PathBuf, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (tmp, segs) = (dir.path(), dir.path().join("segments"));
    assert!(write(&segs).iter().all(|f| !f.is_empty()), "no input written");
    let python = std::env::var_os("ROCEMESH_SPARK_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/rocemesh/spark-venv/bin/python")
    });
    assert!(python.exists(), "{} not found: run analyze/spark/setup (it prints the python to use)", python.display());
    let spark_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("spark");
    let (dataset, ours, theirs) = (tmp.join("dataset"), tmp.join("analyze.parquet"), tmp.join("spark.parquet"));
    let analyze = |args: &[&std::ffi::OsStr]| {
        let out = Command::new(env!("CARGO_BIN_EXE_analyze")).args(args).output().expect("run analyze");
        assert_eq!(out.status.code(), Some(0), "analyze {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let scopes = SCOPES.join(",");
    analyze(&["export".as_ref(), "--partitioned".as_ref(), dataset.as_os_str(), segs.as_os_str()]);
    analyze(&[
        "report".as_ref(),
        "--scope".as_ref(),
        scopes.as_ref(),
        "--window-s".as_ref(),
        "30".as_ref(),
        "--sla-loss".as_ref(),
        "0.01".as_ref(),
        "--format".as_ref(),
        "parquet".as_ref(),
        "--output".as_ref(),
        ours.as_os_str(),
        segs.as_os_str(),
    ]);
    let out = Command::new(&python)
        .arg(spark_dir.join("sla_report.py"))
        .args(["--window-s", "30", "--sla-loss", "0.01", "--driver-memory", "1g"])
        .args(["--scopes", scopes.as_str(), "--input"])
        .arg(&dataset)
        .arg("--output")
        .arg(&theirs)
        .output()
        .expect("run the Spark job");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "Spark job: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("query_s="), "{stdout}");
    let out =
        Command::new(&python).arg(spark_dir.join("compare.py")).arg(&ours).arg(&theirs).output().expect("compare");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "rows differ: {said}\n{}", String::from_utf8_lossy(&out.stderr));
    (dir, ours, theirs, said)
}

#[test]
#[ignore = "needs a JRE and pyspark: scripts/test installs them (analyze/spark/setup) and runs it"]
fn spark_sql_report_equals_analyze_report() {
    let (_dir, ours, theirs, said) = both_reports(write_agents_with_services);
    // The connection columns were compared, not only the counts.
    assert!(said.contains("remote_resolution") && said.contains("remote_qpn"), "service columns not compared: {said}");
    let rows: u64 = said
        .split_whitespace()
        .skip_while(|w| *w != "compared:")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no row count in {said}"));
    // 16 minutes of 30 s windows: in each, cluster, four ToR pairs, two ToRs, four RNICs,
    // sixteen RNIC pairs (self-probes included) and two connections.
    assert!(rows >= 32 * 29, "too few rows compared: {said}");
    // compare.py finds the two row sets equal; a scope missing from both would pass it, so each
    // file must have rows of every requested scope, and of no other.
    for path in [&ours, &theirs] {
        use polars::prelude::*;
        let df = ParquetReader::new(std::fs::File::open(path).expect("open")).finish().expect("read parquet");
        let scope = df.column("scope").expect("scope column").str().expect("str");
        let entity = df.column("entity").expect("entity column").str().expect("str");
        let keys: BTreeSet<(&str, &str)> =
            (0..df.height()).filter_map(|i| Some((scope.get(i)?, entity.get(i)?))).collect();
        let found: BTreeSet<&str> = keys.iter().map(|k| k.0).collect();
        assert_eq!(found, SCOPES.into_iter().collect::<BTreeSet<_>>(), "{}: scopes of the rows", path.display());
        let unresolved =
            keys.iter().filter(|(s, e)| *s == "service" && e.contains("->gid:") && e.ends_with(UNKNOWN_REMOTE));
        assert_eq!(unresolved.count(), 1, "{}: the unresolved connection's row", path.display());
        // The dead minutes of that connection are unreachable in its rows, so the rule ran.
        let unreachable = df.column("unreachable").expect("unreachable").cast(&DataType::UInt64).expect("cast");
        let unreachable = unreachable.u64().expect("u64");
        assert!(
            (0..df.height()).any(|i| scope.get(i) == Some("service") && unreachable.get(i).unwrap_or(0) > 0),
            "{}: no unreachable service row",
            path.display()
        );
        // A self-probe is its own pair; same-ToR records have their own ToR pair.
        for key in [
            ("service", NAMED_SERVICE),
            ("pair", "wa-h0/mlx5_0->wa-h0/mlx5_0"),
            ("pair", "wb-h1/mlx5_0->wa-h0/mlx5_0"),
            ("tor_pair", "tor-a->tor-a"),
            ("tor_pair", "tor-b->tor-a"),
        ] {
            assert!(keys.contains(&key), "{}: no row {key:?}", path.display());
        }
    }
    eprintln!("{said}");
}

/// A mesh-only input: the export has no connection columns (they are written only when some
/// file defines a service; report.rs checks the export), and the job, asked for every scope, gives what analyze gives: the
/// same rows, none of them in the service scope.
#[test]
#[ignore = "needs a JRE and pyspark: scripts/test installs them (analyze/spark/setup) and runs it"]
fn without_services_both_give_the_same_rows_and_no_service_row() {
    let (_dir, ours, theirs, said) = both_reports(write_agents);
    assert!(said.contains("pair=") && !said.contains("service="), "{said}");
    for path in [&ours, &theirs] {
        use polars::prelude::*;
        let df = ParquetReader::new(std::fs::File::open(path).expect("open")).finish().expect("read parquet");
        let scope = df.column("scope").expect("scope column").str().expect("str");
        assert!(df.height() > 0, "{}: no rows", path.display());
        assert!((0..df.height()).all(|i| scope.get(i) != Some("service")), "{}: a service row", path.display());
    }
}
