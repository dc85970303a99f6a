//! The SLA report as a Spark SQL job (analyze/spark/sla_report.py), run by pyspark in local mode
//! over `analyze export --partitioned`, checked row by row against `analyze report` on the same
//! segments (analyze/spark/compare.py: every count and quantile equal).
//!
//! Needs a JRE and pyspark, so it is #[ignore]d in a plain `cargo test`; scripts/test installs
//! both (analyze/spark/setup) and runs it with ROCEMESH_SPARK_PYTHON set.

use std::path::PathBuf;
use std::process::Command;

mod common;
use common::write_agents;

#[test]
#[ignore = "needs a JRE and pyspark: scripts/test installs them (analyze/spark/setup) and runs it"]
fn spark_sql_report_equals_analyze_report() {
    let python = std::env::var_os("ROCEMESH_SPARK_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/rocemesh/spark-venv/bin/python")
    });
    assert!(python.exists(), "{} not found: run analyze/spark/setup (it prints the python to use)", python.display());
    let spark_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("spark");
    let tmp = tempfile::tempdir().expect("tempdir");
    let segs = tmp.path().join("segments");
    let agents = write_agents(&segs);
    assert!(agents.iter().all(|f| !f.is_empty()), "no input written");
    let (dataset, ours, theirs) =
        (tmp.path().join("dataset"), tmp.path().join("analyze.parquet"), tmp.path().join("spark.parquet"));
    let analyze = |args: &[&std::ffi::OsStr]| {
        let out = Command::new(env!("CARGO_BIN_EXE_analyze")).args(args).output().expect("run analyze");
        assert_eq!(out.status.code(), Some(0), "analyze {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    analyze(&["export".as_ref(), "--partitioned".as_ref(), dataset.as_os_str(), segs.as_os_str()]);
    analyze(&[
        "report".as_ref(),
        "--scope".as_ref(),
        "cluster,tor,rnic".as_ref(),
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
        .args(["--window-s", "30", "--sla-loss", "0.01", "--driver-memory", "1g", "--input"])
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
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "rows differ: {said}\n{}", String::from_utf8_lossy(&out.stderr));
    let rows: u64 = said
        .split_whitespace()
        .skip_while(|w| *w != "compared:")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no row count in {said}"));
    // 16 minutes of 30 s windows: cluster, two ToRs and four RNICs in each.
    assert!(rows >= 32 * 7, "too few rows compared: {said}");
    eprintln!("{said}");
}
