//! `ctl diff`: what a push would change on each host.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use rocemesh_formats::pinglist::{Pinglist, ProbeKind, Target};

use crate::pinglist_dir::PinglistDir;
use crate::push::Destination;
use crate::remote::run_parallel;
use crate::status::{Fetched, fetch};

/// A target's identity in a pinglist (the format keeps it unique).
pub type TargetKey = (String, String, ProbeKind);

/// What changes on one host.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostDiff {
    pub host: String,
    /// The generation the host holds (`None`: no file, or unreadable).
    pub old_generation: Option<u64>,
    pub new_generation: Option<u64>,
    pub added: Vec<TargetKey>,
    pub removed: Vec<TargetKey>,
    /// Targets in both, with the fields that differ.
    pub changed: Vec<(TargetKey, Vec<&'static str>)>,
    /// Pinglist-wide fields that differ (`timeout_ms`).
    pub fields: Vec<&'static str>,
    /// The host has no pinglist yet.
    pub missing: bool,
    /// Why the host's side could not be compared (unreachable, invalid file).
    pub error: Option<String>,
}

impl HostDiff {
    /// Whether a push would change anything on the host.
    pub fn changes(&self) -> bool {
        self.missing
            || self.old_generation != self.new_generation
            || !(self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty() && self.fields.is_empty())
    }
}

fn key(t: &Target) -> TargetKey {
    (t.from.clone(), t.to.clone(), t.kind)
}

// ProbeKind has no order; its on-disk code does, and sorts the output.
fn order(t: &Target) -> (&str, &str, u8) {
    (&t.from, &t.to, t.kind.as_u8())
}

/// The difference between what a host holds (`old`) and what would be pushed (`new`).
pub fn diff_pinglists(host: &str, old: Option<&Pinglist>, new: &Pinglist) -> HostDiff {
    let mut d = HostDiff {
        host: host.to_owned(),
        old_generation: old.map(|p| p.generation),
        new_generation: Some(new.generation),
        missing: old.is_none(),
        ..HostDiff::default()
    };
    let old_targets: BTreeMap<(&str, &str, u8), &Target> =
        old.map(|p| p.targets.iter().map(|t| (order(t), t)).collect()).unwrap_or_default();
    let new_targets: BTreeMap<(&str, &str, u8), &Target> = new.targets.iter().map(|t| (order(t), t)).collect();
    for (k, n) in &new_targets {
        match old_targets.get(k) {
            None => d.added.push(key(n)),
            Some(o) => {
                let mut fields = Vec::new();
                if o.addr != n.addr {
                    fields.push("addr");
                }
                if o.port != n.port {
                    fields.push("port");
                }
                if o.qpn != n.qpn {
                    fields.push("qpn");
                }
                if o.rate_pps != n.rate_pps {
                    fields.push("rate_pps");
                }
                if o.flow_labels != n.flow_labels {
                    fields.push("flow_labels");
                }
                if !fields.is_empty() {
                    d.changed.push((key(n), fields));
                }
            }
        }
    }
    d.removed = old_targets.iter().filter(|(k, _)| !new_targets.contains_key(*k)).map(|(_, t)| key(t)).collect();
    if let Some(o) = old
        && o.timeout_ms != new.timeout_ms
    {
        d.fields.push("timeout_ms");
    }
    d
}

/// Compares the pinglists of `hosts` in `from` with what `against` holds.
pub fn diff(
    from: &PinglistDir,
    hosts: &[String],
    against: &Destination,
    parallel: usize,
    done: impl Fn(&HostDiff) + Sync,
) -> Vec<HostDiff> {
    run_parallel(
        hosts,
        parallel,
        |host| {
            let new = match from.read(host) {
                Ok((_, p)) => p,
                Err(e) => {
                    return HostDiff {
                        host: host.clone(),
                        error: Some(format!("local pinglist refused: {e}")),
                        ..HostDiff::default()
                    };
                }
            };
            match fetch(against, host) {
                Err(e) => HostDiff {
                    host: host.clone(),
                    new_generation: Some(new.generation),
                    error: Some(e),
                    ..HostDiff::default()
                },
                Ok(Fetched::Missing) => diff_pinglists(host, None, &new),
                Ok(Fetched::Present { text, .. }) => match Pinglist::parse(&text, Path::new(&against.location(host))) {
                    Ok(old) => diff_pinglists(host, Some(&old), &new),
                    Err(e) => HostDiff {
                        host: host.clone(),
                        new_generation: Some(new.generation),
                        error: Some(format!("the host's pinglist is invalid, a push replaces it: {e}")),
                        ..HostDiff::default()
                    },
                },
            }
        },
        done,
    )
}

fn kind(k: ProbeKind) -> &'static str {
    match k {
        ProbeKind::TorMesh => "tor_mesh",
        ProbeKind::InterTor => "inter_tor",
        ProbeKind::Service => "service",
    }
}

/// One line per host (and with `verbose` one per changed target), then a summary.
pub fn render(diffs: &[HostDiff], verbose: bool) -> String {
    let mut out = String::new();
    let show = |g: Option<u64>| g.map_or_else(|| "-".to_owned(), |g| g.to_string());
    let (mut changing, mut same, mut failed) = (0, 0, 0);
    for d in diffs {
        if let Some(e) = &d.error {
            failed += 1;
            let _ = writeln!(out, "{}: cannot compare: {e}", d.host);
            continue;
        }
        if !d.changes() {
            same += 1;
            continue;
        }
        changing += 1;
        let what = if d.missing { " (no pinglist on the host yet)".to_owned() } else { String::new() };
        let _ = writeln!(
            out,
            "{}: generation {} -> {}, targets +{} -{} ~{}{}{what}",
            d.host,
            show(d.old_generation),
            show(d.new_generation),
            d.added.len(),
            d.removed.len(),
            d.changed.len(),
            if d.fields.is_empty() { String::new() } else { format!(", {} changed", d.fields.join(", ")) },
        );
        if verbose {
            for (from, to, k) in &d.added {
                let _ = writeln!(out, "  + {from} -> {to} ({})", kind(*k));
            }
            for (from, to, k) in &d.removed {
                let _ = writeln!(out, "  - {from} -> {to} ({})", kind(*k));
            }
            for ((from, to, k), fields) in &d.changed {
                let _ = writeln!(out, "  ~ {from} -> {to} ({}): {}", kind(*k), fields.join(", "));
            }
        }
    }
    let _ = writeln!(out, "{changing} host(s) would change, {same} unchanged, {failed} could not be compared");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocemesh_formats::pinglist;

    fn target(to: &str, kind: ProbeKind, labels: &[u32]) -> Target {
        Target {
            from: "mlx5_0".into(),
            to: to.into(),
            tor: String::new(),
            kind,
            addr: "10.0.0.9".parse().unwrap(),
            port: None,
            qpn: None,
            rate_pps: 1.0,
            flow_labels: labels.to_vec(),
        }
    }

    fn pl(generation: u64, targets: Vec<Target>) -> Pinglist {
        Pinglist {
            version: pinglist::VERSION,
            host: "h".into(),
            generation,
            generated_unix_ns: 0,
            timeout_ms: 500,
            targets,
        }
    }

    #[test]
    fn added_removed_changed_and_generation() {
        let old = pl(
            3,
            vec![
                target("a/d", ProbeKind::TorMesh, &[1]),
                target("b/d", ProbeKind::InterTor, &[1, 2]),
                target("c/d", ProbeKind::InterTor, &[5]),
            ],
        );
        let mut new = pl(
            4,
            vec![
                target("a/d", ProbeKind::TorMesh, &[1]),
                target("b/d", ProbeKind::InterTor, &[1, 3]),
                target("e/d", ProbeKind::InterTor, &[5]),
            ],
        );
        new.timeout_ms = 800;
        let d = diff_pinglists("h", Some(&old), &new);
        assert_eq!((d.old_generation, d.new_generation), (Some(3), Some(4)));
        assert_eq!(d.added, [("mlx5_0".to_owned(), "e/d".to_owned(), ProbeKind::InterTor)]);
        assert_eq!(d.removed, [("mlx5_0".to_owned(), "c/d".to_owned(), ProbeKind::InterTor)]);
        assert_eq!(d.changed, [(("mlx5_0".to_owned(), "b/d".to_owned(), ProbeKind::InterTor), vec!["flow_labels"])]);
        assert_eq!(d.fields, ["timeout_ms"]);
        let text = render(&[d], true);
        assert!(text.starts_with("h: generation 3 -> 4, targets +1 -1 ~1, timeout_ms changed\n"), "{text}");
        assert!(text.contains("  ~ mlx5_0 -> b/d (inter_tor): flow_labels"), "{text}");

        let same = diff_pinglists("h", Some(&new), &new);
        assert!(!same.changes());
        let fresh = diff_pinglists("h", None, &new);
        assert!(fresh.changes() && fresh.missing && fresh.added.len() == 3);
        assert!(
            render(&[same, fresh], false).ends_with("1 host(s) would change, 1 unchanged, 0 could not be compared\n")
        );
    }
}
