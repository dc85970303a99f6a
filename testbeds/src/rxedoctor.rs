//! `agent doctor` on a real rxe host of the VM lab, with the config its agent runs: it must see
//! the device, its active Ethernet port and the RoCE v2 GID of the host's address, say that rxe
//! has no completion timestamps (the host-poll clock), fail nothing, and its JSON must parse.
//! The table goes to DIR/doctor.txt for the record.

use std::path::Path;
use std::process::Command;

use anyhow::Context;
use serde_json::Value;

use crate::harness::Check;

/// Runs the doctor in `host`'s namespace on `config`; `ip` is the shard's address.
pub(crate) fn check(agent: &Path, host: &str, config: &Path, ip: &str, dir: &Path) -> anyhow::Result<Check> {
    let run = |format: &str| {
        Command::new("ip")
            .args(["netns", "exec", host])
            .arg(agent)
            .args(["doctor", "--format", format, "--config"])
            .arg(config)
            .output()
            .with_context(|| format!("running agent doctor in {host}"))
    };
    let table = run("table")?;
    std::fs::write(dir.join("doctor.txt"), &table.stdout).context("writing doctor.txt")?;
    let json = run("json")?;
    let doc: Value = serde_json::from_slice(&json.stdout).unwrap_or(Value::Null);
    let checks = doc["checks"].as_array().cloned().unwrap_or_default();
    let level = |area: &str, text: &str| {
        checks
            .iter()
            .find(|c| c["area"] == area && c["detail"].as_str().is_some_and(|d| d.contains(text)))
            .and_then(|c| c["level"].as_str().map(str::to_owned))
    };
    let mut wrong = Vec::new();
    let mut expect = |what: &str, got: Option<String>, want: &str| {
        if got.as_deref() != Some(want) {
            wrong.push(format!("{what}: {} (want {want})", got.as_deref().unwrap_or("missing")));
        }
    };
    expect("active Ethernet port", level("port", "ACTIVE, link layer Ethernet"), "ok");
    expect("the host's RoCE v2 GID", level("gid", &format!(": {ip} (eth0)")), "ok");
    expect("rxe's host-poll clock", level("clock", "no completion timestamps"), "warn");
    expect("the config", level("config", &format!("host {host}")), "ok");
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| c["level"] == "fail")
        .map(|c| format!("{} {}: {}", c["area"], c["subject"], c["detail"]))
        .collect();
    wrong.extend(failed.iter().map(|f| format!("failed: {f}")));
    let code = json.status.code().unwrap_or(-1);
    if code == 2 || code < 0 || checks.is_empty() {
        wrong.push(format!("exit {code}, {} checks", checks.len()));
    }
    let detail = if wrong.is_empty() {
        format!("exit {code}, {} checks as expected (doctor.txt)", checks.len())
    } else {
        format!("{}; stdout: {}", wrong.join("; "), String::from_utf8_lossy(&table.stdout))
    };
    Ok(Check { name: "agent doctor on an rxe host".into(), ok: wrong.is_empty(), detail })
}
