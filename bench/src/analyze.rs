//! `bench analyze`: `analyze report` end to end on a fleet's worth of segments, against DuckDB
//! running the same aggregation on the same probes exported to Parquet, in the same run.
//!
//! The data: `rnics` RNICs in ToRs of 32, each one agent shard writing its own segments with the
//! realistic stream of [`crate::synth`] (31 ToR-mesh targets at 10/s, 5 inter-ToR targets at
//! 1/s), its dictionary naming real fleet peers. It is generated once per parameter set into
//! `dir` and reused by later runs (a manifest records what is there).
//!
//! Measured: the wall time of the `analyze report --scope cluster,tor,rnic --format parquet`
//! process (ingest included), of `analyze localize` (its ranges, and one range holding the
//! whole input, whose output must be the same), of `analyze export`, and of DuckDB's query (read Parquet, the same
//! scopes, windows, counts and nearest-rank quantiles, write Parquet). Then both outputs are
//! compared row by row, every count and quantile, so the ratio compares equal work. DuckDB
//! comes from PyPI into a venv under `~/.cache/rocemesh/venv`; the bench does not link polars,
//! it runs the analyze binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use rocemesh_formats::record::EndpointRole;
use rocemesh_formats::segment::{OPEN_SUFFIX, SegmentWriter, WriterConfig, WriterIdentity, seal};

use crate::synth::ShardStream;

/// RNICs per ToR: the stream's 31 ToR-mesh targets are the other RNICs of the prober's ToR.
const RNICS_PER_TOR: usize = 32;
/// The stream's inter-ToR targets.
const INTER_TOR_TARGETS: usize = 5;
/// First probe time: window-aligned, fixed so reruns produce the same bytes.
const START_UNIX_NS: u64 = 1_700_000_010_000_000_000;
/// Bump when the generated data changes, so old directories are regenerated. 2: sealed files
/// end in their summary; 3: segments carry window summaries, as agents' do by default; 4: sealed
/// files are zstd frames per group of one content, indexed in their summary.
const DATA_VERSION: u32 = 4;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Probe records in all.
    pub records: u64,
    /// RNICs (agent shards, one writer each); a multiple of 32, at least 64.
    pub rnics: usize,
    /// Where the segments, Parquet files and outputs go.
    pub dir: PathBuf,
    /// Seal the segments (zstd), as shipped, instead of leaving them open (uncompressed).
    pub sealed: bool,
    /// The analyze binary.
    pub analyze_bin: PathBuf,
    /// Python venv with DuckDB; `None`: the DuckDB baseline is not run (`--no-duckdb`).
    pub venv: Option<PathBuf>,
    /// Report window, seconds.
    pub window_s: u64,
    /// Timed runs of each side; the median is reported (a shared VM's runs vary by 10-30%).
    pub runs: usize,
    /// A second input of this many records, in this directory: `analyze report` alone runs on
    /// it too, so one run states how peak memory follows the input's length.
    pub scale: Option<(u64, PathBuf)>,
    /// Thread counts to run report, localize, export and html under once each (`--threads`).
    pub threads: Vec<usize>,
    /// Every analyze process of this run held to this many threads (rayon's pool and
    /// polars'); `None`: as many as the machine has.
    pub pin_threads: Option<usize>,
}

/// One measured figure.
#[derive(Debug, Clone)]
pub struct Figure {
    /// What.
    pub what: String,
    /// Value.
    pub value: f64,
    /// Unit.
    pub unit: &'static str,
    /// Comparison or context.
    pub note: String,
}

/// Generates (or reuses) the data, runs analyze and DuckDB, checks they agree.
pub fn run(opt: &Options) -> Result<Vec<Figure>> {
    ensure!(
        opt.rnics >= 2 * RNICS_PER_TOR && opt.rnics.is_multiple_of(RNICS_PER_TOR),
        "--rnics must be a multiple of {RNICS_PER_TOR} and at least {}",
        2 * RNICS_PER_TOR
    );
    let segments = opt.dir.join(if opt.sealed { "segments-sealed" } else { "segments-open" });
    let gen_s = ensure_data(opt, &segments)?;
    let (files, bytes) = dir_size(&segments)?;
    let python = opt.venv.as_deref().map(ensure_duckdb).transpose()?;
    let mut out = Vec::new();
    if let Some(s) = gen_s {
        out.push(Figure {
            what: "generate segments (once, reused by later runs)".into(),
            value: opt.records as f64 / s,
            unit: "records/s",
            note: format!("{s:.1} s"),
        });
    }
    let note_data = data_note(opt, files, bytes);

    let report_pq = opt.dir.join("analyze-report.parquet");
    let report = time_report(opt, &segments, &report_pq)?;
    let localize = measure_localize(opt, &segments, &mut out)?;
    out.push(timed_figure(
        "analyze report (cluster,tor,rnic), process wall time".into(),
        opt.records as f64,
        opt.runs,
        &report,
        &format!("; {note_data}"),
    ));

    if let Some((records, dir)) = &opt.scale {
        measure_scale(opt, &segments, *records, dir, &report, &localize, &mut out)?;
    }

    let probes_pq = measure_export(opt, &segments, &mut out)?;
    measure_threads(opt, &segments, &mut out)?;
    let Some(python) = python else {
        out.push(Figure {
            what: "DuckDB baseline: not run (--no-duckdb)".into(),
            value: 0.0,
            unit: "",
            note: "no ratio against DuckDB from this run".into(),
        });
        return Ok(out);
    };

    let script = opt.dir.join("duckdb_report.py");
    std::fs::write(&script, DUCKDB_SCRIPT)?;
    let duck_pq = opt.dir.join("duckdb-report.parquet");
    let duck = match time_duckdb(opt, &python, &script, &probes_pq, &duck_pq) {
        Ok(d) => d,
        Err(e) => {
            // DuckDB running out of memory is a result, not a reason to lose analyze's figures.
            out.push(duckdb_failed(e));
            return Ok(out);
        }
    };
    out.extend(duckdb_figures(opt, &duck, &report));
    out.push(compare_reports(&python, &script, &report_pq, &duck_pq)?);
    Ok(out)
}

/// What the input is, for the note of `analyze report`'s figure.
fn data_note(opt: &Options, files: usize, bytes: u64) -> String {
    format!(
        "{} records, {} RNICs, {files} {} segment files, {:.2} GB, {:.1} B/record",
        opt.records,
        opt.rnics,
        if opt.sealed { "sealed" } else { "open" },
        bytes as f64 / 1e9,
        bytes as f64 / opt.records as f64
    )
}

/// A timed run's peak RSS, GB.
fn rss_gb(t: &Timed) -> f64 {
    t.max_rss_kib as f64 / 1048576.0
}

/// `analyze report --scope cluster,tor,rnic` of `segments` into `output`, the median run.
fn time_report(opt: &Options, segments: &Path, output: &Path) -> Result<Timed> {
    let scopes = "cluster,tor,rnic";
    let window = opt.window_s.to_string();
    median_of(opt.runs, || {
        run_timed(
            analyze_cmd(opt)
                .args(["report", "--scope", scopes, "--window-s", &window, "--format", "parquet", "--output"])
                .arg(output)
                .arg(segments),
            "analyze report",
        )
    })
}

/// `analyze localize --evidence EVIDENCE` of `segments` with its JSON written to `json`, the
/// median run.
fn time_localize(
    opt: &Options,
    segments: &Path,
    json: &Path,
    range_records: Option<u64>,
    evidence: &str,
) -> Result<Timed> {
    let window = opt.window_s.to_string();
    // `--range-records` None: the default ranges; Some(n): ranges of n records.
    median_of(opt.runs, || {
        let mut cmd = analyze_cmd(opt);
        cmd.args(["localize", "--evidence", evidence, "--window-s", &window, "--format", "json", "--output"]).arg(json);
        if let Some(n) = range_records {
            cmd.arg("--range-records").arg(n.to_string());
        }
        run_timed(cmd.arg(segments), "analyze localize")
    })
}

/// `analyze localize` over its ranges and over one range, which must agree; the ranged run.
fn measure_localize(opt: &Options, segments: &Path, out: &mut Vec<Figure>) -> Result<Timed> {
    let n = opt.records as f64;
    let localize_json = opt.dir.join("analyze-localize.json");
    let localize = time_localize(opt, segments, &localize_json, None, "records")?;
    out.push(timed_figure(
        "analyze localize (4 passes over ranges of whole windows), process wall time".into(),
        n,
        opt.runs,
        &localize,
        "",
    ));
    // The same localisation with one range holding the whole input: what it cost before it
    // read ranges. Its output must be the same, byte for byte.
    let whole_json = opt.dir.join("analyze-localize-one-range.json");
    let whole = time_localize(opt, segments, &whole_json, Some(1 << 40), "records")?;
    ensure!(
        std::fs::read(&whole_json)? == std::fs::read(&localize_json)?,
        "analyze localize: one range and the default ranges disagree ({} and {})",
        whole_json.display(),
        localize_json.display()
    );
    out.push(Figure {
        what: "analyze localize, one range holding the whole input (the baseline)".into(),
        value: rss_gb(&localize) / rss_gb(&whole),
        unit: "x",
        note: format!(
            "peak RSS of the ranges against one range: {:.2} GB against {:.2} GB; one range: median of {} runs ({}): {:.2} s wall, {:.2} s CPU; the same JSON",
            rss_gb(&localize),
            rss_gb(&whole),
            opt.runs,
            whole.spread,
            whole.wall_s,
            whole.cpu_s
        ),
    });
    measure_localize_summaries(opt, segments, &localize_json, &localize, out)?;
    Ok(localize)
}

/// `analyze localize` from the data's window summaries against the records' run: its time, and
/// that it names the same findings (kind, entity, start, end).
fn measure_localize_summaries(
    opt: &Options,
    segments: &Path,
    records_json: &Path,
    records: &Timed,
    out: &mut Vec<Figure>,
) -> Result<()> {
    let json = opt.dir.join("analyze-localize-summaries.json");
    let summaries = time_localize(opt, segments, &json, None, "summaries")?;
    let findings = |path: &Path| -> Result<(Vec<String>, serde_json::Value)> {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path)?)?;
        let f = v["findings"].as_array().context("findings")?;
        let named =
            f.iter().map(|f| format!("{} {} {} {}", f["kind"], f["entity"], f["start_ns"], f["end_ns"])).collect();
        Ok((named, v["evidence"].clone()))
    };
    let ((from_records, _), (from_summaries, evidence)) = (findings(records_json)?, findings(&json)?);
    ensure!(
        from_records == from_summaries,
        "analyze localize: the window summaries name other findings than the records ({} and {})",
        json.display(),
        records_json.display()
    );
    ensure!(evidence["files_folded"] == 0, "analyze localize folded records of the bench's data: {evidence}");
    out.push(Figure {
        what: "analyze localize from the window summaries (one read), against the records (4 passes)".into(),
        value: records.wall_s / summaries.wall_s,
        unit: "x",
        note: format!(
            "median of {} runs ({}): {:.2} s wall, {:.2} s CPU, {:.2} GB peak RSS, against {:.2} s, {:.2} s, {:.2} GB; the same {} findings",
            opt.runs,
            summaries.spread,
            summaries.wall_s,
            summaries.cpu_s,
            rss_gb(&summaries),
            records.wall_s,
            records.cpu_s,
            rss_gb(records),
            from_records.len()
        ),
    });
    Ok(())
}

/// `--scale`: report and localize on the longer input, and how their peak RSS grew.
fn measure_scale(
    opt: &Options,
    segments: &Path,
    records: u64,
    dir: &Path,
    report: &Timed,
    localize: &Timed,
    out: &mut Vec<Figure>,
) -> Result<()> {
    let n = opt.records as f64;
    let big = Options { records, dir: dir.to_path_buf(), scale: None, ..opt.clone() };
    let big_segments = dir.join(segments.file_name().context("segments directory")?);
    std::fs::create_dir_all(dir)?;
    ensure_data(&big, &big_segments)?;
    let (big_files, big_bytes) = dir_size(&big_segments)?;
    let big_report = time_report(opt, &big_segments, &dir.join("analyze-report.parquet"))?;
    out.push(timed_figure(
        format!("analyze report on {records} records (same fleet, longer)"),
        records as f64,
        opt.runs,
        &big_report,
        &format!("; {big_files} files, {:.2} GB", big_bytes as f64 / 1e9),
    ));
    out.push(Figure {
        what: format!("peak RSS ratio at {:.1}x the records", records as f64 / n),
        value: rss_gb(&big_report) / rss_gb(report),
        unit: "x",
        note: format!(
            "{:.2} GB against {:.2} GB (issue 38 asks at most 1.3x for 4x at 1,024 RNICs)",
            rss_gb(&big_report),
            rss_gb(report)
        ),
    });
    let big_localize = time_localize(opt, &big_segments, &dir.join("analyze-localize.json"), None, "records")?;
    out.push(timed_figure(
        format!("analyze localize on {records} records (same fleet, longer)"),
        records as f64,
        opt.runs,
        &big_localize,
        "",
    ));
    out.push(Figure {
        what: format!("localize peak RSS ratio at {:.1}x the records", records as f64 / n),
        value: rss_gb(&big_localize) / rss_gb(localize),
        unit: "x",
        note: format!("{:.2} GB against {:.2} GB", rss_gb(&big_localize), rss_gb(localize)),
    });
    Ok(())
}

/// `analyze export --parquet` of the segments (DuckDB's input); returns the Parquet file.
fn measure_export(opt: &Options, segments: &Path, out: &mut Vec<Figure>) -> Result<PathBuf> {
    let probes_pq = opt.dir.join(if opt.sealed { "probes-zstd.parquet" } else { "probes-uncompressed.parquet" });
    let compression = compression(opt);
    let export = time_export(opt, segments, &probes_pq)?;
    let pq_bytes = std::fs::metadata(&probes_pq)?.len();
    out.push(Figure {
        what: "analyze export --parquet (input of DuckDB)".into(),
        value: opt.records as f64 / export.wall_s,
        unit: "records/s",
        note: format!(
            "median of {} runs ({}): {:.2} s wall, {compression}, {:.2} GB, peak RSS {:.2} GB",
            opt.runs,
            export.spread,
            export.wall_s,
            pq_bytes as f64 / 1e9,
            rss_gb(&export)
        ),
    });
    Ok(probes_pq)
}

/// The Parquet compression of the export: zstd for sealed input (as shipped), else none.
fn compression(opt: &Options) -> &'static str {
    if opt.sealed { "zstd" } else { "uncompressed" }
}

/// `analyze export --parquet` of `segments` into `output`, the median run.
fn time_export(opt: &Options, segments: &Path, output: &Path) -> Result<Timed> {
    let window = opt.window_s.to_string();
    median_of(opt.runs, || {
        run_timed(
            analyze_cmd(opt)
                .args(["export", "--window-s", &window, "--compression", compression(opt), "--parquet"])
                .arg(output)
                .arg(segments),
            "analyze export",
        )
    })
}

/// `analyze html` of `segments` into `output` (localisation from the summaries, as it chooses
/// on sealed segments), the median run.
fn time_html(opt: &Options, segments: &Path, output: &Path) -> Result<Timed> {
    let window = opt.window_s.to_string();
    median_of(opt.runs, || {
        run_timed(
            analyze_cmd(opt).args(["html", "--window-s", &window, "--output"]).arg(output).arg(segments),
            "analyze html",
        )
    })
}

/// The analyze binary, held to `opt.pin_threads` threads where set. Both pools are capped:
/// analyze's own work runs on rayon's global pool, polars' on its own.
fn analyze_cmd(opt: &Options) -> Command {
    let mut cmd = Command::new(&opt.analyze_bin);
    if let Some(n) = opt.pin_threads {
        cmd.env("RAYON_NUM_THREADS", n.to_string()).env("POLARS_MAX_THREADS", n.to_string());
    }
    cmd
}

/// `--threads`: report, localize from the records and from the summaries, export and html
/// (medians of `--runs`) under every thread count, against the first count's wall time: how
/// each step scales with the cores it is given, in one run on one machine. Every count must
/// write the same page.
fn measure_threads(opt: &Options, segments: &Path, out: &mut Vec<Figure>) -> Result<()> {
    let dir = opt.dir.join("threads");
    std::fs::create_dir_all(&dir)?;
    let mut first: Option<(usize, [f64; 5])> = None;
    let mut first_page: Option<Vec<u8>> = None;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    for &n in &opt.threads {
        let o = Options { pin_threads: Some(n), ..opt.clone() };
        let steps = [
            ("analyze report", time_report(&o, segments, &dir.join("report.parquet"))?),
            ("analyze localize (records)", time_localize(&o, segments, &dir.join("records.json"), None, "records")?),
            (
                "analyze localize (summaries)",
                time_localize(&o, segments, &dir.join("summaries.json"), None, "summaries")?,
            ),
            ("analyze export", time_export(&o, segments, &dir.join("probes.parquet"))?),
            ("analyze html", time_html(&o, segments, &dir.join("page.html"))?),
        ];
        let page = std::fs::read(dir.join("page.html"))?;
        ensure!(
            *first_page.get_or_insert_with(|| page.clone()) == page,
            "analyze html: held to {n} threads it wrote another page than held to {} ({})",
            opt.threads[0],
            dir.join("page.html").display()
        );
        let (n0, base) = *first.get_or_insert((n, steps.each_ref().map(|(_, t)| t.wall_s)));
        for ((what, t), b) in steps.iter().zip(base) {
            out.push(Figure {
                what: format!("--threads {n}: {what}, process wall time"),
                value: t.wall_s,
                unit: "s",
                note: format!(
                    "median of {} runs ({}), {:.2} s CPU, {:.2} GB peak RSS; {:.2}x as fast as with {n0} thread(s){}",
                    opt.runs,
                    t.spread,
                    t.cpu_s,
                    rss_gb(t),
                    b / t.wall_s,
                    match t.projected_s {
                        Some((p, serial)) => format!(
                            "; more threads than cores: {p:.2} s on {n} cores, projected from its runnable threads ({serial:.2} s with one runnable)"
                        ),
                        None if n > cores => "; more threads than cores, but no projection: /proc/PID/task/*/schedstat gave no profile of the run (a kernel without CONFIG_SCHEDSTATS?)".into(),
                        None => String::new(),
                    }
                ),
            });
        }
    }
    Ok(())
}

/// DuckDB's query on the Parquet export, the median run, timed by the query alone.
fn time_duckdb(opt: &Options, python: &Path, script: &Path, probes_pq: &Path, duck_pq: &Path) -> Result<Timed> {
    median_of(opt.runs, || {
        let mut t = run_timed(
            Command::new(python)
                .arg(script)
                .args(["query", &(opt.window_s * 1_000_000_000).to_string()])
                .arg(probes_pq)
                .arg(duck_pq),
            "DuckDB",
        )?;
        // DuckDB's own query time, not the Python interpreter's start-up around it.
        let (query_s, version) = parse_query(&t.stdout)?;
        t.process_s = t.wall_s;
        t.wall_s = query_s;
        t.stdout = version;
        Ok(t)
    })
}

/// The figure that stands for DuckDB's when its query failed: the end of its error.
fn duckdb_failed(e: anyhow::Error) -> Figure {
    let e = format!("{e:#}");
    let tail = e.char_indices().rev().nth(300).map_or(&e[..], |(i, _)| &e[i..]);
    Figure {
        what: "DuckDB, same aggregation on the Parquet export".into(),
        value: f64::NAN,
        unit: "records/s",
        note: format!("DuckDB failed, so no ratio and no row check: ...{}", tail.replace('\n', " ")),
    }
}

/// DuckDB's throughput, and analyze report's against it.
fn duckdb_figures(opt: &Options, duck: &Timed, report: &Timed) -> [Figure; 2] {
    let query_s = duck.wall_s;
    [
        Figure {
            what: "DuckDB, same aggregation on the Parquet export".into(),
            value: opt.records as f64 / query_s,
            unit: "records/s",
            note: format!(
                "duckdb {}, median of {} runs ({}): {query_s:.2} s query (read Parquet, write Parquet); process {:.2} s wall, {:.2} s CPU, peak RSS {:.2} GB",
                duck.stdout.trim(),
                opt.runs,
                duck.spread,
                duck.process_s,
                duck.cpu_s,
                rss_gb(duck)
            ),
        },
        Figure {
            what: "ratio analyze report / DuckDB (records/s)".into(),
            value: query_s / report.wall_s,
            unit: "x",
            note: "analyze's time includes reading the segments; DuckDB's its Parquet scan; warm page cache for both"
                .into(),
        },
    ]
}

/// The two reports compared row by row, every count and quantile.
fn compare_reports(python: &Path, script: &Path, report_pq: &Path, duck_pq: &Path) -> Result<Figure> {
    let check = run_timed(
        Command::new(python).arg(script).arg("compare").arg(report_pq).arg(duck_pq),
        "comparison of the two reports",
    )?;
    let rows = check.stdout.trim();
    let rows: f64 = rows.parse().with_context(|| format!("the comparison printed {rows:?}, not its row count"))?;
    Ok(Figure {
        what: "rows compared, every count and quantile equal".into(),
        value: rows,
        unit: "rows",
        note: "cluster, tor and rnic rows of every window".into(),
    })
}

/// Seconds the generation took, or `None` when the data was already there.
fn ensure_data(opt: &Options, segments: &Path) -> Result<Option<f64>> {
    let manifest = segments.join("MANIFEST");
    let want = format!(
        "version={DATA_VERSION} records={} rnics={} sealed={} start={START_UNIX_NS}\n",
        opt.records, opt.rnics, opt.sealed
    );
    if std::fs::read_to_string(&manifest).is_ok_and(|m| m == want) {
        return Ok(None);
    }
    if segments.exists() {
        std::fs::remove_dir_all(segments).with_context(|| format!("removing stale {}", segments.display()))?;
    }
    std::fs::create_dir_all(segments)?;
    eprintln!(
        "bench analyze: generating {} records from {} RNICs into {} (once)",
        opt.records,
        opt.rnics,
        segments.display()
    );
    let t = Instant::now();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(opt.rnics);
    let per = opt.records / opt.rnics as u64;
    let extra = opt.records % opt.rnics as u64;
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|w| {
                s.spawn(move || -> Result<()> {
                    for r in (w..opt.rnics).step_by(threads) {
                        let n = per + u64::from((r as u64) < extra);
                        write_rnic(segments, opt.rnics, r, n, opt.sealed)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| anyhow::anyhow!("a generator thread panicked"))??;
        }
        Ok(())
    })?;
    std::fs::write(&manifest, want)?;
    Ok(Some(t.elapsed().as_secs_f64()))
}

fn rnic_name(rnics: usize, tor: usize, j: usize) -> (String, String) {
    let tors = rnics / RNICS_PER_TOR;
    let tor = tor % tors;
    (format!("su{tor:03}-h{j:02}/mlx5_0", j = j % RNICS_PER_TOR), format!("su{tor:03}-tor"))
}

/// One RNIC's agent: its segments, with a dictionary that names its real peers.
fn write_rnic(segments: &Path, rnics: usize, r: usize, records: u64, sealed: bool) -> Result<()> {
    let tors = rnics / RNICS_PER_TOR;
    let (tor, j) = (r / RNICS_PER_TOR, r % RNICS_PER_TOR);
    let (name, tor_name) = rnic_name(rnics, tor, j);
    let (host, device) = name.split_once('/').context("host/device")?;
    let id = WriterIdentity {
        host: host.into(),
        device: device.into(),
        tor: tor_name.clone(),
        agent_epoch: r as u32 + 1,
        tool: "rocemesh-bench".into(),
    };
    let cfg = WriterConfig {
        summary_window_ns: rocemesh_formats::window::DEFAULT_WINDOW_S * 1_000_000_000,
        ..WriterConfig::new(segments.join(host))
    };
    let mut w = SegmentWriter::new(cfg, id)?;
    // Ids as the stream uses them: 0 = itself, 1..=31 = the rest of its ToR, 32.. = other ToRs.
    let mut ends = vec![(name.clone(), tor_name.clone())];
    ends.extend((1..RNICS_PER_TOR).map(|k| rnic_name(rnics, tor, j + k)));
    ends.extend((0..INTER_TOR_TARGETS).map(|m| rnic_name(rnics, tor + 1 + m % (tors - 1), j + 7 * m)));
    for (id, (n, t)) in ends.iter().enumerate() {
        ensure!(
            w.endpoint(EndpointRole::Rnic, n, t, [0; 16]) == id as u32,
            "{n} is named twice in {name}'s dictionary"
        );
    }
    let mut stream = ShardStream::new(0x5EED + r as u64, START_UNIX_NS);
    for _ in 0..records {
        w.append(&stream.next_record())?;
    }
    for p in w.finish()? {
        if sealed && p.to_string_lossy().ends_with(OPEN_SUFFIX) {
            seal(&p, 3)?;
        }
    }
    Ok(())
}

fn dir_size(dir: &Path) -> Result<(usize, u64)> {
    let (mut files, mut bytes) = (0, 0);
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            let (f, b) = dir_size(&e.path())?;
            files += f;
            bytes += b;
        } else if e.file_name().to_string_lossy().contains(".rseg") {
            files += 1;
            bytes += e.metadata()?.len();
        }
    }
    Ok((files, bytes))
}

/// The venv's python with DuckDB importable, created on first use.
fn ensure_duckdb(venv: &Path) -> Result<PathBuf> {
    let python = venv.join("bin").join("python");
    let has = |py: &Path| {
        Command::new(py)
            .args(["-c", "import duckdb"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if has(&python) {
        return Ok(python);
    }
    eprintln!("bench analyze: installing DuckDB from PyPI into {}", venv.display());
    let status = Command::new("python3").arg("-m").arg("venv").arg(venv).status();
    if !status.is_ok_and(|s| s.success()) {
        bail!("`python3 -m venv {}` failed: install python3 and python3-venv (scripts/setup does)", venv.display());
    }
    let status = Command::new(venv.join("bin").join("pip")).args(["install", "--quiet", "duckdb"]).status()?;
    ensure!(status.success() && has(&python), "pip install duckdb into {} failed", venv.display());
    Ok(python)
}

/// A process's throughput over `records`, with its median, spread, CPU and peak RSS; `extra`
/// ends the note.
fn timed_figure(what: String, records: f64, runs: usize, t: &Timed, extra: &str) -> Figure {
    Figure {
        what,
        value: records / t.wall_s,
        unit: "records/s",
        note: format!(
            "median of {runs} runs ({}): {:.2} s wall, {:.2} s CPU, peak RSS {:.2} GB{extra}",
            t.spread,
            t.wall_s,
            t.cpu_s,
            rss_gb(t)
        ),
    }
}

pub(crate) struct Timed {
    pub(crate) wall_s: f64,
    pub(crate) cpu_s: f64,
    pub(crate) max_rss_kib: u64,
    stdout: String,
    /// The whole process's wall time where `wall_s` is a part of it.
    process_s: f64,
    /// "min-max s" over the runs the median was taken from.
    spread: String,
    /// Held to more threads than this machine has cores: the wall time on as many cores,
    /// projected from its runnable threads ([`projected_wall_s`]), and the seconds it had one
    /// thread runnable (serial, or waiting on one).
    projected_s: Option<(f64, f64)>,
}

/// The run with the median wall time of `runs` (at least one).
fn median_of(runs: usize, mut run: impl FnMut() -> Result<Timed>) -> Result<Timed> {
    let mut all = (0..runs.max(1)).map(|_| run()).collect::<Result<Vec<_>>>()?;
    all.sort_by(|a, b| a.wall_s.total_cmp(&b.wall_s));
    let spread = match (all.first(), all.last()) {
        (Some(a), Some(b)) => format!("{:.2}-{:.2} s", a.wall_s, b.wall_s),
        _ => String::new(),
    };
    let mut m = all.swap_remove(all.len() / 2);
    m.spread = spread;
    Ok(m)
}

/// Runs `cmd` to completion; fails with its stderr unless it exits 0.
pub(crate) fn run_timed(cmd: &mut Command, what: &str) -> Result<Timed> {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let oversubscribed = cmd
        .get_envs()
        .find(|(k, _)| *k == "RAYON_NUM_THREADS")
        .and_then(|(_, v)| v?.to_str()?.parse::<usize>().ok())
        .filter(|&n| n > cores);
    let t = Instant::now();
    let child =
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().with_context(|| format!("starting {what}"))?;
    let pid = child.id() as libc::pid_t;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = oversubscribed.map(|_| {
        let done = done.clone();
        std::thread::spawn(move || sample_runnable(pid, &done))
    });
    // Read the pipes on threads so a chatty child cannot block on a full pipe while we wait.
    let mut child = child;
    let mut so = child.stdout.take().context("stdout")?;
    let mut se = child.stderr.take().context("stderr")?;
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut so, &mut s).map(|_| s)
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut se, &mut s).map(|_| s)
    });
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our own unwaited child; both out-pointers are valid for the call. wait4
    // rather than Child::wait because it also returns the child's own CPU time and peak RSS.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall_s = t.elapsed().as_secs_f64();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let profile = sampler.map(|h| h.join().map_err(|_| anyhow::anyhow!("sampler thread"))).transpose()?;
    ensure!(rc == pid, "waiting for {what}: {}", std::io::Error::last_os_error());
    let stdout = out_t.join().map_err(|_| anyhow::anyhow!("reader thread"))??;
    let stderr = err_t.join().map_err(|_| anyhow::anyhow!("reader thread"))??;
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    ensure!(ok, "{what} failed (wait status {status}):\n{stderr}");
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Timed {
        wall_s,
        cpu_s: tv(usage.ru_utime) + tv(usage.ru_stime),
        max_rss_kib: usage.ru_maxrss as u64,
        stdout,
        process_s: wall_s,
        spread: String::new(),
        // A profile that missed most of the run (schedstat unreadable: no CONFIG_SCHEDSTATS or
        // /proc hidden) projects nothing rather than a figure of what it missed.
        projected_s: oversubscribed
            .zip(
                profile
                    .filter(|p| p.iter().map(|i| i.s).sum::<f64>() > 0.5 * wall_s && p.iter().any(|i| i.cpu_s > 0.0)),
            )
            .map(|(n, p)| {
                (projected_wall_s(&p, n), p.iter().filter(|i| (0.5..1.5).contains(&i.runnable)).map(|i| i.s).sum())
            }),
    })
}

/// One interval of [`sample_runnable`]: its length, the CPU time its threads ran, and how
/// many threads could run on average (on a CPU or waiting for one), all in seconds or threads.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Interval {
    s: f64,
    cpu_s: f64,
    runnable: f64,
}

/// Every 10 ms until `done`, each thread's time on a CPU and waiting for one
/// (`/proc/PID/task/*/schedstat`, nanoseconds), summed over the process's threads: an
/// interval's runnable threads are that sum's growth over its length. A process held to more
/// threads than the machine has cores keeps them all runnable where its work is parallel, and
/// one where it is serial, so its profile tells what more cores would do for it.
fn sample_runnable(pid: libc::pid_t, done: &std::sync::atomic::AtomicBool) -> Vec<Interval> {
    let tasks = format!("/proc/{pid}/task");
    let snapshot = || -> std::collections::HashMap<String, (u64, u64)> {
        let Ok(dir) = std::fs::read_dir(&tasks) else { return Default::default() };
        dir.flatten()
            .filter_map(|e| {
                let text = std::fs::read_to_string(e.path().join("schedstat")).ok()?;
                let mut f = text.split_whitespace().map(|x| x.parse::<u64>().ok());
                Some((e.file_name().to_string_lossy().into_owned(), (f.next()??, f.next()??)))
            })
            .collect()
    };
    let (mut before, mut at) = (snapshot(), Instant::now());
    let mut out = Vec::new();
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(10));
        let now = snapshot();
        let s = at.elapsed().as_secs_f64();
        at = Instant::now();
        if now.is_empty() {
            break;
        }
        let (mut run_ns, mut wait_ns) = (0u64, 0u64);
        for (tid, &(run, wait)) in &now {
            let (r0, w0) = before.get(tid).copied().unwrap_or((0, 0));
            run_ns += run.saturating_sub(r0);
            wait_ns += wait.saturating_sub(w0);
        }
        out.push(Interval { s, cpu_s: run_ns as f64 / 1e9, runnable: (run_ns + wait_ns) as f64 / 1e9 / s });
        before = now;
    }
    out
}

/// The wall time on `cores` cores of a process profiled by [`sample_runnable`], if each
/// interval's CPU time were spread over as many of its runnable threads as there are cores (an
/// interval with none runnable, waiting on I/O, takes what it took). A model, not a
/// measurement: it leaves out memory bandwidth and caches, and threads spinning for work count
/// as runnable, which makes a serial stretch look parallel (the projection errs fast); a
/// 16-core machine's own run is the figure.
fn projected_wall_s(profile: &[Interval], cores: usize) -> f64 {
    profile.iter().map(|i| if i.runnable < 0.05 { i.s } else { i.cpu_s / i.runnable.min(cores as f64) }).sum()
}

/// `query_s=<seconds> duckdb=<version>` from the script.
fn parse_query(stdout: &str) -> Result<(f64, String)> {
    let mut s = None;
    let mut v = String::new();
    for word in stdout.split_whitespace() {
        if let Some(x) = word.strip_prefix("query_s=") {
            s = x.parse::<f64>().ok();
        } else if let Some(x) = word.strip_prefix("duckdb=") {
            v = x.to_owned();
        }
    }
    Ok((s.with_context(|| format!("no query time in the DuckDB script's output: {stdout}"))?, v))
}

/// The DuckDB side: `query WINDOW_NS IN.parquet OUT.parquet` runs the report's aggregation
/// (same semantics as analyze/src/report.rs: unreachable per window and pair, loss ratio over
/// ok + partial + lost, nearest-rank quantiles = quantile_disc over ok records; rnic and tor
/// rows take a record under both ends, once when they are equal); `compare A B` checks two
/// reports row by row and prints the rows compared.
const DUCKDB_SCRIPT: &str = r#"
import sys, time, duckdb

def query(window_ns, src, dst):
    con = duckdb.connect()
    sql = f"""
    COPY (
    WITH raw AS (
        SELECT (t1_unix_ns // {window_ns}) * {window_ns} AS w, prober_id, target_id, prober, target,
               prober_tor, target_tor, outcome, arrived,
               network_rtt_ns AS rtt, prober_delay_ns AS pd, responder_delay_ns AS rd
        FROM read_parquet('{src}')
    ),
    pair AS (
        SELECT w, prober_id, target_id, any_value(prober) AS prober, any_value(target) AS target,
               any_value(prober_tor) AS prober_tor, any_value(target_tor) AS target_tor,
               count(*) AS probes,
               count(*) FILTER (WHERE outcome = 0) AS ok,
               count(*) FILTER (WHERE outcome = 1 AND arrived & 2 = 0) AS lost_raw,
               count(*) FILTER (WHERE outcome = 1 AND arrived & 2 <> 0) AS partial,
               count(*) FILTER (WHERE outcome = 2) AS invalid,
               count(*) FILTER (WHERE outcome IN (3, 5)) AS refused
        FROM raw GROUP BY w, prober_id, target_id
    ),
    pc AS (
        SELECT *, CASE WHEN ok + partial = 0 THEN lost_raw ELSE 0 END AS unreachable,
               CASE WHEN ok + partial = 0 THEN 0 ELSE lost_raw END AS lost
        FROM pair
    ),
    ends AS (
        SELECT 'cluster' AS scope, w, 'cluster' AS entity, * EXCLUDE (w) FROM pc
        UNION ALL SELECT 'tor', w, prober_tor, * EXCLUDE (w) FROM pc
        UNION ALL SELECT 'tor', w, target_tor, * EXCLUDE (w) FROM pc WHERE target_tor <> prober_tor
        UNION ALL SELECT 'rnic', w, prober, * EXCLUDE (w) FROM pc
        UNION ALL SELECT 'rnic', w, target, * EXCLUDE (w) FROM pc WHERE target_id <> prober_id
    ),
    counts AS (
        SELECT scope, w, entity, sum(probes) AS probes, sum(ok) AS ok, sum(lost) AS lost,
               sum(partial) AS partial, sum(invalid) AS invalid, sum(refused) AS refused,
               sum(unreachable) AS unreachable
        FROM ends GROUP BY scope, w, entity
    ),
    okr AS (SELECT * FROM raw WHERE outcome = 0),
    samples AS (
        SELECT 'cluster' AS scope, w, 'cluster' AS entity, rtt, pd, rd FROM okr
        UNION ALL SELECT 'tor', w, prober_tor, rtt, pd, rd FROM okr
        UNION ALL SELECT 'tor', w, target_tor, rtt, pd, rd FROM okr WHERE target_tor <> prober_tor
        UNION ALL SELECT 'rnic', w, prober, rtt, pd, rd FROM okr
        UNION ALL SELECT 'rnic', w, target, rtt, pd, rd FROM okr WHERE target_id <> prober_id
    ),
    quantiles AS (
        SELECT scope, w, entity,
               quantile_disc(rtt, [0.5, 0.99, 0.999]) AS rq,
               quantile_disc(pd, [0.5, 0.99]) AS pq,
               quantile_disc(rd, [0.5, 0.99]) AS dq
        FROM samples GROUP BY scope, w, entity
    )
    SELECT c.w AS window_start_ns, c.scope, c.entity, c.probes, c.ok, c.lost, c.partial, c.invalid,
           c.refused, c.unreachable,
           CASE WHEN c.ok + c.partial + c.lost > 0 THEN c.lost / (c.ok + c.partial + c.lost) END AS loss_ratio,
           q.rq[1] AS rtt_ns_p50, q.rq[2] AS rtt_ns_p99, q.rq[3] AS rtt_ns_p999,
           q.pq[1] AS prober_delay_ns_p50, q.pq[2] AS prober_delay_ns_p99,
           q.dq[1] AS responder_delay_ns_p50, q.dq[2] AS responder_delay_ns_p99
    FROM counts c LEFT JOIN quantiles q USING (scope, w, entity)
    ) TO '{dst}' (FORMAT parquet)
    """
    t = time.perf_counter()
    con.execute(sql)
    print(f"query_s={time.perf_counter() - t:.4f} duckdb={duckdb.__version__}")

COLS = ["probes", "ok", "lost", "partial", "invalid", "refused", "unreachable", "rtt_ns_p50", "rtt_ns_p99",
        "rtt_ns_p999", "prober_delay_ns_p50", "prober_delay_ns_p99", "responder_delay_ns_p50", "responder_delay_ns_p99"]

def load(con, path):
    rows = con.execute(f"SELECT window_start_ns, scope, entity, loss_ratio, {', '.join(COLS)} FROM read_parquet('{path}')").fetchall()
    return {(int(r[0]), r[1], r[2]): r[3:] for r in rows}

def compare(a_path, b_path):
    con = duckdb.connect()
    a, b = load(con, a_path), load(con, b_path)
    bad = []
    if a.keys() != b.keys():
        bad.append(f"row sets differ: {len(a.keys() - b.keys())} only in analyze, {len(b.keys() - a.keys())} only in DuckDB, e.g. {sorted(a.keys() ^ b.keys())[:3]}")
    for k in sorted(a.keys() & b.keys()):
        x, y = a[k], b[k]
        if (x[0] is None) != (y[0] is None) or (x[0] is not None and abs(x[0] - y[0]) > 1e-12):
            bad.append(f"{k}: loss_ratio {x[0]} != {y[0]}")
        for c, u, v in zip(COLS, x[1:], y[1:]):
            if (None if u is None else int(u)) != (None if v is None else int(v)):
                bad.append(f"{k}: {c} {u} != {v}")
    if bad:
        print("\n".join(bad[:20]), file=sys.stderr)
        sys.exit(1)
    print(len(a))

if __name__ == "__main__":
    if sys.argv[1] == "query":
        query(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        compare(sys.argv[2], sys.argv[3])
"#;

#[cfg(test)]
mod tests {
    use super::{Interval, projected_wall_s};

    #[test]
    fn a_projection_spreads_each_intervals_cpu_over_its_runnable_threads() {
        // One serial second, one second of 2 s CPU with 16 threads runnable, one second idle.
        let profile = [
            Interval { s: 1.0, cpu_s: 1.0, runnable: 1.0 },
            Interval { s: 1.0, cpu_s: 2.0, runnable: 16.0 },
            Interval { s: 1.0, cpu_s: 0.0, runnable: 0.0 },
        ];
        assert_eq!(projected_wall_s(&profile, 16), 1.0 + 2.0 / 16.0 + 1.0);
        assert_eq!(projected_wall_s(&profile, 4), 1.0 + 2.0 / 4.0 + 1.0);
        assert_eq!(projected_wall_s(&profile, 2), 3.0, "the machine it ran on: its own wall time");
    }
}
