use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use proptest::prelude::*;
use rocemesh_formats::inventory::{Host, Rnic, Spine, Tor};

use super::*;
use crate::pinglist_dir::{LOCK, MANIFEST, Manifest, write_generated};

/// P(n uniform draws over m paths hit every path), by inclusion-exclusion.
fn exact_cover_probability(m: u32, n: usize) -> f64 {
    let mut total = 0.0;
    let mut binom = 1.0;
    for k in 0..=m {
        let miss = (f64::from(m - k) / f64::from(m)).powi(n as i32);
        let sign = if k % 2 == 0 { 1.0 } else { -1.0 };
        total += sign * binom * miss;
        binom = binom * f64::from(m - k) / f64::from(k + 1);
    }
    total
}

#[test]
fn label_counts_match_the_formula() {
    // The anchors' figures are for p = 0.9.
    assert_eq!(labels_for_coverage(4, 0.9), 13);
    assert_eq!(labels_for_coverage(8, 0.9), 33);
    assert_eq!(labels_for_coverage(16, 0.9), 78);
    assert_eq!(labels_for_coverage(4, 0.99), 21);
    assert_eq!(labels_for_coverage(1, 0.99), 1);
    assert_eq!(labels_for_coverage(2, 0.5), 2);
    // The formula treats the m "path missed" events as independent; they are not (a label that
    // takes one path does not take another), so it can fall short of the exact figure. Check
    // against inclusion-exclusion: exact for p >= 0.99, at most one label short for p >= 0.9.
    for m in 2..=24 {
        for p in [0.5, 0.9, 0.99, 0.999] {
            let n = labels_for_coverage(m, p);
            if p >= 0.99 {
                assert!(exact_cover_probability(m, n) >= p, "m={m} p={p} n={n}");
            } else if p >= 0.9 {
                assert!(exact_cover_probability(m, n + 1) >= p, "m={m} p={p} n={n}");
            }
            assert!(exact_cover_probability(m, n - 1) < p, "m={m} p={p} n={n} is loose");
        }
    }
}

#[test]
fn labels_are_distinct_nonzero_and_take_distinct_ports() {
    for n in [1, 5, 21, 64, 65, 500, 4000] {
        let labels = flow_labels(99, n);
        assert_eq!(labels.len(), n);
        assert!(labels.iter().all(|&l| (1..=MAX_FLOW_LABEL).contains(&l)));
        let ports: HashSet<u16> = labels.iter().map(|&l| source_port_bits(l)).collect();
        assert_eq!(ports.len(), n, "n={n}");
    }
    // The anchors' formula for the UDP source port.
    assert_eq!(source_port_bits(0x12345) | 0xC000, ((0x12345 & 0x3FFF) ^ ((0x12345 & 0xFC000) >> 14)) as u16 | 0xC000);
    assert_eq!(source_port_bits(0x4001), 0);
}

#[test]
fn distance_blocks_cover_half_the_ring_k_at_a_time() {
    for t in 2..40 {
        for k in 1..t {
            let blocks = distance_blocks(t, t / 2, k);
            assert_eq!(blocks.len(), (t / 2).div_ceil(k), "t={t} k={k}");
            let mut seen = BTreeSet::new();
            for b in &blocks {
                assert_eq!(b.len(), k, "t={t} k={k} {blocks:?}");
                assert_eq!(b.iter().collect::<BTreeSet<_>>().len(), k);
                assert!(b.iter().all(|&d| (1..t).contains(&d)));
                seen.extend(b.iter().copied());
            }
            assert!((1..=t / 2).all(|d| seen.contains(&d)), "t={t} k={k}");
        }
    }
}

/// A fabric: `tors` ToRs, hosts with their RNICs' ToR indices.
fn fabric(tors: &[Option<u16>], hosts: &[Vec<usize>], spines: usize) -> Inventory {
    let mut address = 0u32;
    let inv = Inventory {
        version: 1,
        tors: tors
            .iter()
            .enumerate()
            .map(|(i, &rail)| Tor { name: format!("tor{i}"), rail, addrs: Vec::new() })
            .collect(),
        spines: (0..spines).map(|i| Spine { name: format!("spine{i}"), addrs: Vec::new() }).collect(),
        links: Vec::new(),
        hosts: hosts
            .iter()
            .enumerate()
            .map(|(h, rnics)| Host {
                name: format!("h{h}"),
                rnics: rnics
                    .iter()
                    .enumerate()
                    .map(|(k, &tor)| {
                        address += 1;
                        Rnic {
                            device: format!("mlx5_{k}"),
                            tor: format!("tor{tor}"),
                            ip: IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + address)),
                            gid: None,
                            port: 1,
                            gid_index: Some(3),
                            tor_port: None,
                            netdev: None,
                        }
                    })
                    .collect(),
            })
            .collect(),
    };
    // Only inventories the format accepts.
    let text = inv.to_toml_string().unwrap();
    Inventory::parse(&text, Path::new("inv.toml")).unwrap()
}

fn tor_of(inv: &Inventory) -> HashMap<String, String> {
    inv.hosts
        .iter()
        .flat_map(|h| h.rnics.iter().map(move |r| (Inventory::rnic_name(&h.name, &r.device), r.tor.clone())))
        .collect()
}

fn rail_of(inv: &Inventory) -> HashMap<String, Option<u16>> {
    inv.tors.iter().map(|t| (t.name.clone(), t.rail)).collect()
}

/// Unordered ToR pairs probed inter-ToR by `pinglists`.
fn covered_pairs(inv: &Inventory, pinglists: &[Pinglist]) -> BTreeSet<(String, String)> {
    let tor = tor_of(inv);
    let mut pairs = BTreeSet::new();
    for p in pinglists {
        for t in p.targets.iter().filter(|t| t.kind == ProbeKind::InterTor) {
            let a = tor[&Inventory::rnic_name(&p.host, &t.from)].clone();
            let b = tor[&t.to].clone();
            pairs.insert(if a < b { (a, b) } else { (b, a) });
        }
    }
    pairs
}

/// Every ToR pair that must be covered: ToRs with RNICs, within a rail unless `cross_rail`.
fn required_pairs(inv: &Inventory, cross_rail: bool) -> BTreeSet<(String, String)> {
    let used: BTreeSet<String> = tor_of(inv).into_values().collect();
    let rail = rail_of(inv);
    let mut pairs = BTreeSet::new();
    for a in &used {
        for b in &used {
            if a < b && (cross_rail || rail[a] == rail[b]) {
                pairs.insert((a.clone(), b.clone()));
            }
        }
    }
    pairs
}

#[test]
fn coverage_takes_the_computed_generations_and_not_fewer() {
    // 10 ToRs of one RNIC, K = 2: H = 5 distances in B = 3 blocks, R = 1: N = 3.
    let inv = fabric(&[None; 10], &(0..10).map(|i| vec![i]).collect::<Vec<_>>(), 0);
    let opts = GenOptions { seed: 5, inter_tor_peers: 2, ..GenOptions::default() };
    let g = Generator::new(&inv, &opts).unwrap();
    assert_eq!(g.coverage().generations_to_cover, 3);
    assert_eq!(g.coverage().planes[0].blocks, 3);
    let need = required_pairs(&inv, false);
    for start in 0..6 {
        let mut all = BTreeSet::new();
        for gn in start..start + 3 {
            all.extend(covered_pairs(&inv, &g.generate(gn, 0)));
        }
        assert_eq!(all, need, "generations {start}..{}", start + 3);
        let mut two = BTreeSet::new();
        for gn in start..start + 2 {
            two.extend(covered_pairs(&inv, &g.generate(gn, 0)));
        }
        assert!(two.len() < need.len(), "two generations from {start} already cover every pair");
    }
}

#[test]
fn a_tor_with_enough_rnics_covers_its_pairs_in_one_generation() {
    // 9 ToRs × 4 RNICs, K = 1: H = 4, B = 4, R = 4: N = 1.
    let hosts: Vec<Vec<usize>> = (0..36).map(|h| vec![h % 9]).collect();
    let inv = fabric(&[None; 9], &hosts, 0);
    let g = Generator::new(&inv, &GenOptions { inter_tor_peers: 1, ..GenOptions::default() }).unwrap();
    assert_eq!(g.coverage().generations_to_cover, 1);
    assert_eq!(covered_pairs(&inv, &g.generate(77, 0)), required_pairs(&inv, false));
}

#[test]
fn rail_optimised_fabrics_probe_within_rails_unless_told() {
    // 2 pods × 4 rails; 3 hosts per pod with 4 RNICs, RNIC k on the pod's rail-k ToR.
    let tors: Vec<Option<u16>> = (0..8).map(|i| Some(i as u16 % 4)).collect();
    let hosts: Vec<Vec<usize>> = (0..6).map(|h| (0..4).map(|k| (h / 3) * 4 + k).collect()).collect();
    let inv = fabric(&tors, &hosts, 4);
    let g = Generator::new(&inv, &GenOptions::default()).unwrap();
    let cov = g.coverage();
    assert_eq!(cov.planes.len(), 4);
    assert!(cov.planes.iter().all(|p| p.tors == 2 && p.peers_per_rnic == 1));
    assert_eq!((cov.ecmp_paths, cov.ecmp_paths_from_spines, cov.inter_tor_flow_labels), (4, true, 21));
    let lists = g.generate(1, 0);
    let pairs = covered_pairs(&inv, &lists);
    assert_eq!(pairs, required_pairs(&inv, false));
    let rail = rail_of(&inv);
    assert!(pairs.iter().all(|(a, b)| rail[a] == rail[b]));

    let g = Generator::new(&inv, &GenOptions { cross_rail: true, ..GenOptions::default() }).unwrap();
    assert_eq!(g.coverage().planes.len(), 1);
    let mut all = BTreeSet::new();
    for gn in 0..g.coverage().generations_to_cover {
        all.extend(covered_pairs(&inv, &g.generate(gn, 0)));
    }
    assert_eq!(all, required_pairs(&inv, true));
    assert!(all.iter().any(|(a, b)| rail[a] != rail[b]));
}

#[test]
fn options_are_checked() {
    let inv = fabric(&[None; 2], &[vec![0], vec![1]], 0);
    for (opts, needle) in [
        (GenOptions { coverage_probability: 1.0, ..GenOptions::default() }, "coverage probability"),
        (GenOptions { tor_mesh_rate_pps: 0.0, ..GenOptions::default() }, "--tor-mesh-rate-pps"),
        (GenOptions { inter_tor_rate_pps: 1001.0, ..GenOptions::default() }, "--inter-tor-rate-pps"),
        (GenOptions { ecmp_paths: Some(0), ..GenOptions::default() }, "ECMP"),
        (GenOptions { timeout_ms: 0, ..GenOptions::default() }, "timeout"),
        (GenOptions { ecmp_paths: Some(4096), coverage_probability: 0.999, ..GenOptions::default() }, "distinct UDP"),
    ] {
        let e = Generator::new(&inv, &opts).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    }
}

#[test]
fn the_probe_port_asks_the_agent_to_resolve_the_qpn() {
    let inv = fabric(&[None; 2], &[vec![0], vec![0], vec![1]], 0);
    let g = Generator::new(&inv, &GenOptions { probe_port: Some(18515), ..GenOptions::default() }).unwrap();
    let lists = g.generate(3, 1_700_000_000_000_000_000);
    for t in lists.iter().flat_map(|p| &p.targets) {
        assert_eq!((t.port, t.qpn), (Some(18515), Some(0)));
    }
    assert!(lists.iter().all(|p| p.generation == 3 && p.generated_unix_ns == 1_700_000_000_000_000_000));
}

#[derive(Debug, Clone)]
struct Case {
    inv: Inventory,
    opts: GenOptions,
    start: u64,
}

fn arb_case() -> impl Strategy<Value = Case> {
    let plain = (1usize..9, proptest::collection::vec(proptest::collection::vec(any::<usize>(), 1..4), 1..30))
        .prop_map(|(tors, hosts)| {
            let hosts: Vec<Vec<usize>> = hosts.iter().map(|h| h.iter().map(|t| t % tors).collect()).collect();
            fabric(&vec![None; tors], &hosts, 0)
        });
    let rails = (1usize..4, 1usize..5, 1usize..6, proptest::collection::vec(any::<bool>(), 64)).prop_map(
        |(pods, rails, hosts_per_pod, present)| {
            let tors: Vec<Option<u16>> = (0..pods * rails).map(|i| Some((i % rails) as u16)).collect();
            let mut hosts = Vec::new();
            for p in 0..pods {
                for h in 0..hosts_per_pod {
                    // A host may lack a rail's port (down when described), but keeps one.
                    let mut rnics: Vec<usize> = (0..rails)
                        .filter(|k| present[((p * hosts_per_pod + h) * rails + k) % 64] || *k == 0)
                        .map(|k| p * rails + k)
                        .collect();
                    rnics.dedup();
                    hosts.push(rnics);
                }
            }
            fabric(&tors, &hosts, pods.min(3))
        },
    );
    (
        prop_oneof![plain, rails],
        any::<u64>(),
        0usize..7,
        proptest::option::of(1u32..20),
        prop_oneof![Just(0.9), Just(0.99), 0.5f64..0.999],
        (0.1f64..=1000.0, 0.01f64..=1000.0, 1usize..4, any::<bool>(), 0u64..1 << 40),
        proptest::option::of(1u16..),
    )
        .prop_map(
            |(inv, seed, k, ecmp_paths, p, (mesh_rate, inter_rate, mesh_labels, cross_rail, start), port)| Case {
                inv,
                opts: GenOptions {
                    seed,
                    inter_tor_peers: k,
                    ecmp_paths,
                    coverage_probability: p,
                    tor_mesh_rate_pps: mesh_rate,
                    inter_tor_rate_pps: inter_rate,
                    tor_mesh_flow_labels: mesh_labels,
                    probe_port: port,
                    timeout_ms: 500,
                    cross_rail,
                },
                start,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn generated_pinglists_keep_every_promise(case in arb_case()) {
        let Case { inv, opts, start } = case;
        let g = Generator::new(&inv, &opts).unwrap();
        let cov = g.coverage().clone();
        let tor = tor_of(&inv);
        let rail = rail_of(&inv);
        let per_rail = !opts.cross_rail && inv.tors.iter().all(|t| t.rail.is_some());
        let mut under: HashMap<&str, BTreeSet<String>> = HashMap::new();
        for (rnic, t) in &tor {
            under.entry(t.as_str()).or_default().insert(rnic.clone());
        }
        let n = labels_for_coverage(opts.ecmp_paths.unwrap_or(if inv.spines.is_empty() { 4 } else { inv.spines.len() as u32 }), opts.coverage_probability);
        prop_assert_eq!(cov.inter_tor_flow_labels, n);

        let mut covered = BTreeSet::new();
        for gn in start..start + cov.generations_to_cover.max(1) {
            let lists = g.generate(gn, 1_000 + gn);
            prop_assert_eq!(lists.len(), inv.hosts.len());
            for p in &lists {
                let text = p.to_toml_string().unwrap();
                let parsed = Pinglist::parse(&text, Path::new("pl.toml"));
                prop_assert_eq!(parsed.as_ref(), Ok(p), "{}", text);
                prop_assert_eq!((p.generation, p.generated_unix_ns), (gn, 1_000 + gn));
                let host = inv.hosts.iter().find(|h| h.name == p.host).unwrap();
                for r in &host.rnics {
                    let me = Inventory::rnic_name(&host.name, &r.device);
                    // ToR-mesh: exactly the other RNICs under this RNIC's ToR.
                    let mesh: BTreeSet<String> = p.targets.iter()
                        .filter(|t| t.from == r.device && t.kind == ProbeKind::TorMesh)
                        .map(|t| t.to.clone())
                        .collect();
                    let mut expected = under[r.tor.as_str()].clone();
                    expected.remove(&me);
                    prop_assert_eq!(mesh, expected);
                }
                for t in &p.targets {
                    let from = Inventory::rnic_name(&p.host, &t.from);
                    prop_assert_ne!(&t.to, &from, "self target");
                    prop_assert_eq!(&t.tor, &tor[&t.to], "a target carries its ToR (the agent's metrics label)");
                    let labels: HashSet<u32> = t.flow_labels.iter().copied().collect();
                    prop_assert_eq!(labels.len(), t.flow_labels.len());
                    prop_assert!(t.flow_labels.iter().all(|&l| l != 0));
                    let ports: HashSet<u16> = t.flow_labels.iter().map(|&l| source_port_bits(l)).collect();
                    prop_assert_eq!(ports.len(), t.flow_labels.len());
                    match t.kind {
                        ProbeKind::TorMesh => {
                            prop_assert_eq!(t.rate_pps, opts.tor_mesh_rate_pps);
                            prop_assert_eq!(t.flow_labels.len(), opts.tor_mesh_flow_labels);
                        }
                        ProbeKind::InterTor => {
                            prop_assert_eq!(t.rate_pps, opts.inter_tor_rate_pps);
                            prop_assert_eq!(t.flow_labels.len(), n);
                            let (a, b) = (&tor[&from], &tor[&t.to]);
                            prop_assert_ne!(a, b);
                            if per_rail {
                                prop_assert_eq!(rail[a], rail[b], "cross-rail probe {} -> {}", from, t.to);
                            }
                        }
                        ProbeKind::Service => prop_assert!(false, "no service targets are generated"),
                    }
                }
                // K other ToRs per RNIC, each once.
                for r in &host.rnics {
                    let far: Vec<&String> = p.targets.iter()
                        .filter(|t| t.from == r.device && t.kind == ProbeKind::InterTor)
                        .map(|t| &tor[&t.to])
                        .collect();
                    let distinct: BTreeSet<&&String> = far.iter().collect();
                    prop_assert_eq!(distinct.len(), far.len());
                    let plane = cov.planes.iter().find(|pl| !per_rail || pl.rail == rail[&r.tor]).unwrap();
                    prop_assert_eq!(far.len(), plane.peers_per_rnic);
                }
            }
            covered.extend(covered_pairs(&inv, &lists));
        }
        let required = if opts.inter_tor_peers == 0 { BTreeSet::new() } else { required_pairs(&inv, !per_rail) };
        prop_assert_eq!(covered, required);
    }

    #[test]
    fn generation_is_deterministic_and_ignores_inventory_order(case in arb_case()) {
        let Case { inv, opts, start } = case;
        let once: Vec<String> = Generator::new(&inv, &opts).unwrap().generate(start, 42)
            .iter().map(|p| p.to_toml_string().unwrap()).collect();
        let again: Vec<String> = Generator::new(&inv, &opts).unwrap().generate(start, 42)
            .iter().map(|p| p.to_toml_string().unwrap()).collect();
        prop_assert_eq!(&once, &again);
        let mut shuffled = inv.clone();
        shuffled.hosts.reverse();
        shuffled.tors.reverse();
        for h in &mut shuffled.hosts {
            h.rnics.reverse();
        }
        let reordered: Vec<String> = Generator::new(&shuffled, &opts).unwrap().generate(start, 42)
            .iter().map(|p| p.to_toml_string().unwrap()).collect();
        prop_assert_eq!(&once, &reordered);
        // Another seed gives other labels (when there is anything to label).
        if once.iter().any(|t| t.contains("[[target]]")) {
            let other: Vec<String> = Generator::new(&inv, &GenOptions { seed: opts.seed ^ 1, ..opts.clone() }).unwrap()
                .generate(start, 42).iter().map(|p| p.to_toml_string().unwrap()).collect();
            prop_assert_ne!(&once, &other);
        }
    }

    #[test]
    fn the_written_files_are_the_generated_pinglists(case in arb_case()) {
        let Case { inv, opts, start } = case;
        let g = Generator::new(&inv, &opts).unwrap();
        let expected: BTreeMap<String, String> =
            g.generate(start, 42).iter().map(|p| (format!("{}.toml", p.host), p.to_toml_string().unwrap())).collect();
        let manifest = Manifest {
            generation: start,
            generated_unix_ns: 42,
            seed: opts.seed,
            hosts: g.hosts(),
            generations_to_cover: g.coverage().generations_to_cover,
        };
        let tmp = tempfile::tempdir().unwrap();
        // Each worker renders host after host into one buffer, without building pinglists.
        let report =
            write_generated(tmp.path(), g.hosts(), |i, text, host| g.render_toml(i, start, 42, text, host), &manifest)
                .unwrap();
        prop_assert_eq!(report.written, expected.len());
        prop_assert_eq!(report.bytes, expected.values().map(|t| t.len() as u64).sum::<u64>());
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(tmp.path()).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            // The lock stays (readers lock it too); the incomplete marker must not.
            if name != MANIFEST && name != LOCK {
                files.insert(name.clone(), std::fs::read_to_string(tmp.path().join(&name)).unwrap());
            }
        }
        prop_assert_eq!(&files, &expected);
        for (name, text) in &files {
            prop_assert!(Pinglist::parse(text, Path::new(name)).is_ok(), "{}", text);
        }
    }
}

#[test]
fn a_refilled_pinglist_is_the_fresh_one() {
    // Hosts with 1 to 3 RNICs under ToRs of different sizes, so that a refill meets a
    // pinglist with more targets, fewer, and other label counts than it needs.
    let hosts: Vec<Vec<usize>> = (0..20).map(|h| (0..1 + h % 3).map(|k| (h + k) % 5).collect()).collect();
    let inv = fabric(&[None; 5], &hosts, 0);
    let opts = GenOptions { seed: 9, tor_mesh_flow_labels: 70, probe_port: Some(18515), ..GenOptions::default() };
    let g = Generator::new(&inv, &opts).unwrap();
    let fresh = g.generate(4, 7);
    let mut p = g.pinglist(0, 1, 0);
    for i in (0..g.hosts()).rev().chain(0..g.hosts()).chain([3, 0, 17, 3]) {
        g.pinglist_into(i, 4, 7, &mut p);
        assert_eq!(p, fresh[i], "host {i}");
        assert_eq!(g.pinglist(i, 4, 7), fresh[i], "host {i}");
    }
}

#[test]
fn a_pair_keeps_its_labels_across_generations() {
    let hosts: Vec<Vec<usize>> = (0..24).map(|h| vec![h % 6]).collect();
    let inv = fabric(&[None; 6], &hosts, 8);
    let g = Generator::new(&inv, &GenOptions { seed: 3, ..GenOptions::default() }).unwrap();
    let labels = |generation| {
        g.generate(generation, 0)
            .into_iter()
            .flat_map(|p| {
                let host = p.host.clone();
                p.targets.into_iter().map(move |t| ((host.clone(), t.from, t.to, t.kind.as_u8()), t.flow_labels))
            })
            .collect::<HashMap<_, _>>()
    };
    let (one, two) = (labels(1), labels(2));
    let shared: Vec<_> = one.keys().filter(|k| two.contains_key(*k)).collect();
    assert!(shared.iter().any(|k| k.3 == ProbeKind::InterTor.as_u8()), "no inter-ToR pair in both generations");
    for k in shared {
        assert_eq!(one[k], two[k], "{k:?}");
    }
}
