//! `analyze` and the Prometheus alert rules say the same thing: `deploy/sla.toml` holds
//! analyze's defaults, and the alert expressions carry the same thresholds.

use std::path::Path;

use rocemesh_analyze::probe::Sla;

fn repo_file(rel: &str) -> (std::path::PathBuf, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (path, text)
}

/// The `expr` block of alert `name` in the rules file.
fn alert_expr(rules: &str, name: &str) -> String {
    let start = rules.find(&format!("alert: {name}\n")).unwrap_or_else(|| panic!("no alert {name}"));
    let rest = &rules[start..];
    let expr = rest.find("expr:").expect("expr") + "expr:".len();
    let end = rest[expr..].find("\n        for:").map_or(rest.len(), |e| expr + e);
    rest[expr..end].to_owned()
}

#[test]
fn deploy_sla_toml_is_analyzes_default_and_the_alert_rules_use_it() {
    let (path, _) = repo_file("deploy/sla.toml");
    let sla = Sla::from_file(&path).expect("deploy/sla.toml parses as analyze's --sla-config");
    assert_eq!(sla, Sla::default(), "{}: analyze's defaults and the shipped SLA file differ", path.display());

    let (rules_path, rules) = repo_file("deploy/prometheus/rocemesh-alerts.yml");
    let loss = alert_expr(&rules, "RocemeshLossAboveSla");
    assert!(
        loss.contains(&format!(") > {}", sla.loss_ratio)),
        "{}: the loss alert does not compare with loss_ratio = {}:\n{loss}",
        rules_path.display(),
        sla.loss_ratio
    );
    let rtt = alert_expr(&rules, "RocemeshRttP99AboveSla");
    let le = format!("le=\"{}\"", sla.rtt_p99_us / 1e6);
    assert!(rtt.contains(&le), "{}: the RTT alert does not use the {le} bucket:\n{rtt}", rules_path.display());
    assert!(rtt.contains("> 0.01"), "p99 means more than 1% above the bound:\n{rtt}");
}
