//! `bench gen-pinglists`: `ctl gen-pinglists` on a 100,000-RNIC fabric, in memory and to files
//! (in /dev/shm and in the chosen or temporary directory), beside the cost of merely cloning
//! and serialising the inventory it starts from.

use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use rocemesh_ctl::generation::{GenOptions, Generator};
use rocemesh_ctl::pinglist_dir::{Manifest, serialise, write_generated};
use rocemesh_formats::inventory::{self, Host, Inventory, Rnic, Spine, Tor};

/// The fabric and the generation options.
#[derive(Debug, Clone)]
pub struct Options {
    pub tors: usize,
    pub hosts_per_tor: usize,
    /// Spines, and so ECMP paths (flow labels per inter-ToR target follow from it).
    pub spines: usize,
    /// Other ToRs each RNIC probes (K).
    pub inter_tor_peers: usize,
    /// Where to write the files (a temporary directory is made in it); default: the system's
    /// temporary directory. Its filesystem decides the write figure: tmpfs measures ctl,
    /// a disk measures the disk; /dev/shm is measured as well when it is another filesystem.
    pub dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options { tors: 3125, hosts_per_tor: 32, spines: 4, inter_tor_peers: 5, dir: None }
    }
}

/// One measured step.
#[derive(Debug, Clone)]
pub struct Line {
    pub what: String,
    pub seconds: f64,
    pub note: String,
}

/// The measurements, in report order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub lines: Vec<Line>,
}

impl Report {
    fn push(&mut self, what: &str, seconds: f64, note: String) {
        self.lines.push(Line { what: what.to_owned(), seconds, note });
    }

    /// Seconds of the line whose `what` starts with `prefix`.
    pub fn seconds(&self, prefix: &str) -> Option<f64> {
        self.lines.iter().find(|l| l.what.starts_with(prefix)).map(|l| l.seconds)
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for l in &self.lines {
            writeln!(f, "{:<58} {:>8.3} s  {}", l.what, l.seconds, l.note)?;
        }
        Ok(())
    }
}

/// A fabric of `tors` ToRs with `hosts_per_tor` one-RNIC hosts each (one RNIC per host: the
/// brief's 100,000 RNICs are 100,000 pinglists, the file-count worst case).
pub fn fabric(opt: &Options) -> Inventory {
    let mut hosts = Vec::with_capacity(opt.tors * opt.hosts_per_tor);
    for t in 0..opt.tors {
        for h in 0..opt.hosts_per_tor {
            let n = (t * opt.hosts_per_tor + h) as u32;
            hosts.push(Host {
                name: format!("t{t}-h{h}"),
                rnics: vec![Rnic {
                    device: "mlx5_0".to_owned(),
                    tor: format!("tor{t}"),
                    ip: IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)),
                    gid: None,
                    port: 1,
                    gid_index: Some(3),
                }],
            });
        }
    }
    Inventory {
        version: inventory::VERSION,
        tors: (0..opt.tors).map(|t| Tor { name: format!("tor{t}"), rail: None }).collect(),
        spines: (0..opt.spines).map(|s| Spine { name: format!("spine{s}") }).collect(),
        links: Vec::new(),
        hosts,
    }
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed().as_secs_f64())
}

/// Runs the benchmark.
pub fn run(opt: &Options) -> Result<Report> {
    let inventory = fabric(opt);
    let rnics = inventory.hosts.len();
    let mut report = Report::default();

    let (copy, clone_s) = timed(|| inventory.clone());
    drop(copy);
    report.push("baseline: clone the inventory", clone_s, format!("{rnics} RNICs, {} ToRs", opt.tors));
    let (text, ser_s) = timed(|| inventory.to_toml_string());
    let text = text.context("serialising the inventory")?;
    report.push("baseline: serialise the inventory to TOML", ser_s, format!("{:.1} MiB", mib(text.len())));

    let opts = GenOptions { seed: 1, inter_tor_peers: opt.inter_tor_peers, ..GenOptions::default() };
    let (generator, index_s) = timed(|| Generator::new(&inventory, &opts));
    let generator = generator?;
    report.push("gen: index the inventory (Generator::new)", index_s, format!("{:.2}x the clone", index_s / clone_s));
    let cov = generator.coverage();
    let manifest = Manifest {
        generation: 1,
        generated_unix_ns: 1_700_000_000_000_000_000,
        seed: 1,
        hosts: generator.hosts(),
        generations_to_cover: cov.generations_to_cover,
    };

    // Written before the in-memory lines are measured: building and freeing 100,000 pinglists
    // first leaves glibc's thread arenas full of scattered free chunks, which the writers'
    // threads inherit and which made the write ~0.5 s slower than in `ctl gen-pinglists`,
    // whose writers start on fresh arenas.
    let mut written = Vec::new();
    // Removed only once every figure is taken: removing 100,000 files from a disk leaves the
    // kernel busy for a while after, which slowed the next measurement by 15-30%. Their
    // pages are not written back meanwhile (dirty pages wait ~30 s), and are then discarded.
    let mut outputs = Vec::new();
    for dir in output_dirs(opt.dir.as_deref()) {
        let tmp = tempfile::tempdir_in(&dir).with_context(|| format!("temporary directory in {}", dir.display()))?;
        let (w, write_s) = timed(|| {
            write_generated(
                tmp.path(),
                generator.hosts(),
                |i, p| generator.pinglist_into(i, 1, manifest.generated_unix_ns, p),
                &manifest,
            )
        });
        let w = w?;
        outputs.push(tmp);
        written.push((format!("{} ({})", dir.display(), fs_type(&dir)), w, write_s));
    }

    let (pinglists, gen_s) = timed(|| generator.generate(1, manifest.generated_unix_ns));
    let targets: usize = pinglists.iter().map(|p| p.targets.len()).sum();
    report.push(
        "gen: all pinglists in memory (Generator::generate)",
        gen_s,
        format!(
            "{} pinglists, {targets} targets, {} labels per inter-ToR target; {:.2}x the clone",
            pinglists.len(),
            cov.inter_tor_flow_labels,
            gen_s / clone_s
        ),
    );

    let (bytes, to_toml_s) =
        timed(|| pinglists.iter().map(|p| serialise(p).map(|s| s.len())).sum::<Result<usize, _>>());
    let bytes = bytes?;
    report.push(
        "gen: serialise every pinglist to TOML, one core",
        to_toml_s,
        format!("{:.1} MiB; {:.2}x serialising the inventory", mib(bytes), to_toml_s / ser_s),
    );
    drop(pinglists);

    for (dir, w, write_s) in written {
        report.push(
            "gen: generate and write all files (as ctl does), all cores",
            write_s,
            format!(
                "{} files, {:.1} MiB in {dir}; {:.2}x the in-memory generation",
                w.written,
                mib(w.bytes as usize),
                write_s / gen_s
            ),
        );
        report.push(
            "gen-pinglists end to end (index + generate + write)",
            index_s + write_s,
            format!("in {dir}; every ToR pair in {} generation(s)", cov.generations_to_cover),
        );
    }
    drop(outputs);
    Ok(report)
}

/// `dir` (default: the system's temporary directory), and /dev/shm when it is another
/// filesystem: tmpfs measures ctl, a disk measures ctl plus the disk, so both are reported.
fn output_dirs(dir: Option<&Path>) -> Vec<PathBuf> {
    let chosen = dir.map_or_else(std::env::temp_dir, Path::to_path_buf);
    let shm = Path::new("/dev/shm");
    let device = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    let mut dirs = Vec::new();
    if shm.is_dir() && device(shm) != device(&chosen) {
        dirs.push(shm.to_path_buf());
    }
    dirs.push(chosen);
    dirs
}

/// The type of the filesystem holding `dir`, from /proc/mounts (the longest mount point
/// above it); "?" when that cannot be read.
fn fs_type(dir: &Path) -> String {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else { return "?".to_owned() };
    mounts
        .lines()
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let (_, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            dir.starts_with(point).then(|| (point.len(), kind.to_owned()))
        })
        .max_by_key(|&(len, _)| len)
        .map_or_else(|| "?".to_owned(), |(_, kind)| kind)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}
