"""The SLA report of `analyze report` as a Spark SQL job.

Reads the raw probe table that `analyze export` writes (one Parquet file, or a Hive-partitioned
directory `date=YYYY-MM-DD/hour=HH/tor=NAME/*.parquet`, whose partition columns are ignored) and
writes the rows of `analyze report --scope cluster,tor_pair,tor,rnic,pair,service --window-s N
--format parquet` (or of any subset of those scopes): one row per (window, scope, entity) with the same
columns and the same numbers, so that a fleet too large for one machine can be reported on an
existing Spark cluster. `compare.py` beside this file checks the two outputs row by row.

The semantics mirrored (analyze/src/report.rs and analyze/src/probe.rs; bench/src/analyze.rs has
the same query for DuckDB, for cluster, tor and rnic):

- window = floor(t1_unix_ns / window_ns) * window_ns, aligned on the wall clock.
- a record's class comes from its outcome byte and arrival bitmap: 0 ok; 1 lost, or partial when
  ACK1 arrived (arrived & 2); 2 invalid; 3 or 5 refused (5: by authentication); 4 local_drop;
  any other byte counts in
  `probes` only.
- the unreachable rule is applied per (window, prober, target) before any roll-up: a pair with no
  ok and no partial has its lost probes counted as `unreachable`, not `lost`. A `pair` row is
  one such (window, prober, target); every other scope sums them.
- loss_ratio = lost / (ok + partial + lost) as a double, null when that sum is 0.
- scopes (report.rs `KeySpace::keys` and `Prepared::collect_rows`): `cluster`; `tor_pair`,
  entity `prober_tor->target_tor`, every record once under its ordered pair of ToRs, same-ToR
  pairs (`tor-a->tor-a`) included; `tor`, every record whose prober or target hangs off the ToR
  (a ToR-local record once); `rnic`, every record whose prober or target is the RNIC (a
  self-probe once); `pair`, entity `prober->target`, every record once (a self-probe is its own
  pair, `h0->h0`). An RNIC without a ToR, and the unknown RNIC, are under "(no tor)" in `tor`
  and `tor_pair`, as in the export's prober_tor and target_tor. RNIC and ToR names stand for
  fleet and ToR ids (ingest keys its dictionary by name, every id no dictionary defined is
  "(unknown rnic)", and the report keys ToRs by name), so grouping by names groups as the
  report's ids do; names that themselves contain `->` could make two pairs' entities equal,
  where the report would write two rows with one entity.
- delay quantiles are over ok records only, nearest rank: the value at 1-based rank
  max(ceil(q * n), 1) of the n sorted samples, with q * n computed in double precision exactly as
  `nearest_rank_index` does: each row's ok samples are collected and sorted, and the value at
  that index is read. No approximate function is used. Spark's percentile_disc agrees in 3.5.9
  (checked), but returns a double and, in releases without the fix of SPARK-44871 (2023),
  picked index floor((n - 1) * q), which is not nearest rank (n = 150, q = 0.99: 147, not 148),
  so the rank is computed here in SQL whatever the Spark release.
- ts_source: the timestamp sources of the ok samples, ORed per pair as a bitmask and then per
  row; one name (`nic`, `host_poll`, `kernel_software`, `kernel_hardware`, `unknown` for bytes
  above 3), `mixed(a+b)` in that order when several, null without ok samples.
- sla_violations: `loss` when loss_ratio > --sla-loss, `rtt_p99` when rtt_ns_p99 > --sla-rtt-p99-us
  * 1000, joined by `;` (empty within the SLA). Rows are sorted as the report sorts them:
  violations first, then window, scope in the order of probe.rs's `Scope` enum (cluster,
  tor_pair, tor, rnic, pair, service), entity (byte order, as Rust compares
  strings).

- service (asked for like any other scope): one row per (window, traced connection), from the
  connection's probes alone, with the unreachable rule applied per (window, connection); the
  entity is the connection's label (`comm[pid] qp local_qpn->remote_qpn prober->remote`), which
  the export writes in `service_entity` with the connection's other fields in `service_*`; the
  rows then carry nine more columns, as analyze's do when the scope is asked for (service,
  prober, remote, remote_resolution, pid, comm, local_qpn, remote_qpn, flow_label; null in the
  other scopes' rows). analyze keys these rows by its connection ids and this job by those
  fields, so two connections with the same label and fields would be one row here and two
  there (the same pid, both QP numbers and both ends: one connection seen twice).

Not mirrored: the integer types (Spark writes signed 64-bit integers where analyze writes
unsigned ones; the values are the same).

Usage: python sla_report.py --window-s N --input DIR_OR_FILE --output OUT.parquet
       [--scopes cluster,tor_pair,tor,rnic,pair,service] [--master local[*]] [--driver-memory 4g]
Prints `query_s=<seconds> spark=<version> rows=<n>` last.
"""

import argparse
import glob
import os
import shutil
import sys
import time

from pyspark.sql import SparkSession

# The scopes this job computes, in the report's row order (probe.rs's `Scope` enum, derived
# Ord: cluster, tor_pair, tor, rnic, pair, service).
SCOPES = ("cluster", "tor_pair", "tor", "rnic", "pair", "service")
# The export's columns of a service probe's connection (analyze/src/export.rs SERVICE_COLUMNS)
# and the report's names for them, with their SQL type; `service` itself is the export's column
# of that name (the connection's dictionary name).
SERVICE_COLUMNS = (
    ("service", "service", "STRING"),
    ("service_prober", "prober", "STRING"),
    ("service_remote", "remote", "STRING"),
    ("service_remote_resolution", "remote_resolution", "STRING"),
    ("service_pid", "pid", "BIGINT"),
    ("service_comm", "comm", "STRING"),
    ("service_local_qpn", "local_qpn", "BIGINT"),
    ("service_remote_qpn", "remote_qpn", "BIGINT"),
    ("service_flow_label", "flow_label", "BIGINT"),
)
# Counts per class of a group of records, and the timestamp sources of its ok ones as a bitmask
# (bit = the source byte; bytes above 3 all on bit 4, "unknown").
CLASS_COUNTS = """count(*) AS probes,
               count(*) FILTER (WHERE outcome = 0) AS ok,
               count(*) FILTER (WHERE outcome = 1 AND arrived & 2 = 0) AS lost_raw,
               count(*) FILTER (WHERE outcome = 1 AND arrived & 2 <> 0) AS partial,
               count(*) FILTER (WHERE outcome = 2) AS invalid,
               count(*) FILTER (WHERE outcome IN (3, 5)) AS refused,
               count(*) FILTER (WHERE outcome = 4) AS local_drop,
               coalesce(bit_or(shiftleft(1, LEAST(ts_source, 4))) FILTER (WHERE outcome = 0), 0) AS ts_mask"""
# The sums of a roll-up, and the unreachable rule applied to a group's counts.
SUMS = """sum(probes) AS probes, sum(ok) AS ok, sum(lost) AS lost, sum(partial) AS partial,
               sum(invalid) AS invalid, sum(refused) AS refused, sum(unreachable) AS unreachable,
               sum(local_drop) AS local_drop, bit_or(ts_mask) AS ts_mask"""
UNREACHABLE = """IF(ok + partial = 0, lost_raw, 0) AS unreachable,
               IF(ok + partial = 0, 0, lost_raw) AS lost"""

# Partition columns of `analyze export --partitioned`: directory names, not probe data.
PARTITION_COLUMNS = ("date", "hour", "tor")
# (delay column, output column, q): the report's QUANTILES, in its order.
QUANTILES = [
    ("rtt", "rtt_ns_p50", 0.5),
    ("rtt", "rtt_ns_p99", 0.99),
    ("rtt", "rtt_ns_p999", 0.999),
    ("pd", "prober_delay_ns_p50", 0.5),
    ("pd", "prober_delay_ns_p99", 0.99),
    ("rd", "responder_delay_ns_p50", 0.5),
    ("rd", "responder_delay_ns_p99", 0.99),
]


def ends_sql(scopes):
    """`LATERAL VIEW stack(...) ends AS scope, entity`: the rows a record (or a pair's counts)
    counts in. The second end of an either-end scope (tor, rnic) is NULL, and then filtered out
    by the caller's `WHERE entity IS NOT NULL`, when it equals the first (a ToR-local record, a
    self-probe: counted once). The pair scopes have one end, `from->to`, whatever the ends."""
    rows = []
    if "cluster" in scopes:
        rows.append("'cluster', 'cluster'")
    if "tor_pair" in scopes:
        rows.append("'tor_pair', concat(prober_tor, '->', target_tor)")
    if "tor" in scopes:
        rows.append("'tor', prober_tor")
        rows.append("'tor', IF(target_tor <> prober_tor, target_tor, NULL)")
    if "rnic" in scopes:
        rows.append("'rnic', prober")
        rows.append("'rnic', IF(target <> prober, target, NULL)")
    if "pair" in scopes:
        rows.append("'pair', concat(prober, '->', target)")
    body = ",\n            ".join(rows)
    return f"LATERAL VIEW stack({len(rows)},\n            {body}) ends AS scope, entity"


def nearest_rank_index(q, n="q.n"):
    """0-based index of the q-quantile among the n sorted samples: analyze's nearest_rank_index,
    ((n as f64 * q).ceil() - 1.0).max(0.0), in the same double arithmetic."""
    return f"CAST(GREATEST(CEIL(CAST({n} AS DOUBLE) * {float(q)!r}D) - 1, 0) AS INT)"


def scope_rank_sql():
    """The report's scope order as a sort key (the rank of `scope` in SCOPES)."""
    whens = " ".join(f"WHEN '{s}' THEN {i}" for i, s in enumerate(SCOPES))
    return f"CASE scope {whens} END"


def report_sql(window_ns, scopes, sla_loss, sla_rtt_p99_us):
    picks = ",\n           ".join(f"q.{m}[{nearest_rank_index(q)}] AS {name}" for m, name, q in QUANTILES)
    keyed = [s for s in scopes if s != "service"]
    service = "service" in scopes
    conn = ", ".join(c for c, _, _ in SERVICE_COLUMNS)
    # The rows' counts and sorted samples: one branch for the scopes keyed by ends (through the
    # per-pair counts), one for the service scope (keyed by connection), unioned.
    counts, samples = [], []
    nulls = ", ".join(f"CAST(NULL AS {t}) AS {c}" for c, _, t in SERVICE_COLUMNS)
    if keyed:
        counts.append(f"""
        SELECT w, scope, entity, {SUMS}, {nulls}
        FROM pc
        {ends_sql(keyed)}
        WHERE entity IS NOT NULL
        GROUP BY w, scope, entity""")
        samples.append(f"""
        SELECT w, scope, entity, count(*) AS n,
               sort_array(collect_list(rtt)) AS rtt,
               sort_array(collect_list(pd)) AS pd,
               sort_array(collect_list(rd)) AS rd
        FROM raw
        {ends_sql(keyed)}
        WHERE outcome = 0 AND entity IS NOT NULL
        GROUP BY w, scope, entity""")
    if service:
        # Per (window, connection): the unreachable rule applies to the connection's own
        # probes, as analyze's service_rows does, not to the pair they share with the mesh.
        counts.append(f"""
        SELECT w, 'service' AS scope, service_entity AS entity,
               probes, ok, lost, partial, invalid, refused, unreachable, local_drop, ts_mask, {conn}
        FROM (SELECT *, {UNREACHABLE}
              FROM (SELECT w, service_entity, {conn}, {CLASS_COUNTS}
                    FROM raw WHERE service_entity IS NOT NULL
                    GROUP BY w, service_entity, {conn}))""")
        samples.append(f"""
        SELECT w, 'service' AS scope, service_entity AS entity, count(*) AS n,
               sort_array(collect_list(rtt)) AS rtt,
               sort_array(collect_list(pd)) AS pd,
               sort_array(collect_list(rd)) AS rd
        FROM raw
        WHERE outcome = 0 AND service_entity IS NOT NULL
        GROUP BY w, service_entity""")
    service_out = "".join(f",\n           {c} AS {name}" for c, name, _ in SERVICE_COLUMNS) if service else ""
    raw_service = f", service_entity, {conn}" if service else ""
    union = "\n        UNION ALL".join
    return f"""
    WITH raw AS (
        SELECT (CAST(t1_unix_ns AS BIGINT) div {window_ns}) * {window_ns} AS w,
               prober, target, prober_tor, target_tor, outcome, arrived, ts_source,
               network_rtt_ns AS rtt, prober_delay_ns AS pd, responder_delay_ns AS rd{raw_service}
        FROM probes
    ),
    -- Per (window, prober, target): records by class, and the timestamp sources of the ok ones.
    pair AS (
        SELECT w, prober, target, prober_tor, target_tor,
               {CLASS_COUNTS}
        FROM raw
        GROUP BY w, prober, target, prober_tor, target_tor
    ),
    -- The unreachable rule, per pair and window, before any roll-up.
    pc AS (
        SELECT *,
               {UNREACHABLE}
        FROM pair
    ),
    counts AS ({union(counts)}
    ),
    -- Every ok record's delays under each of its (scope, entity), sorted per row.
    samples AS ({union(samples)}
    ),
    joined AS (
        SELECT c.*,
               {picks},
               IF(c.ok + c.partial + c.lost > 0,
                  CAST(c.lost AS DOUBLE) / CAST(c.ok + c.partial + c.lost AS DOUBLE), NULL) AS loss_ratio,
               transform(filter(sequence(0, 4), b -> (c.ts_mask & shiftleft(1, b)) <> 0),
                         b -> element_at(array('nic', 'host_poll', 'kernel_software', 'kernel_hardware', 'unknown'), b + 1))
                   AS ts_names
        FROM counts c LEFT JOIN samples q USING (w, scope, entity)
    ),
    rows AS (
        SELECT *,
               concat_ws(';',
                   IF(loss_ratio > {float(sla_loss)!r}D, 'loss', NULL),
                   IF(CAST(rtt_ns_p99 AS DOUBLE) > {float(sla_rtt_p99_us)!r}D * 1000D, 'rtt_p99', NULL)) AS sla_violations
        FROM joined
    )
    SELECT w AS window_start_ns,
           date_format(timestamp_seconds(w div 1000000000), "yyyy-MM-dd'T'HH:mm:ss'Z'") AS window_start,
           scope, entity, probes, ok, lost, partial, invalid, refused, unreachable, loss_ratio,
           rtt_ns_p50, rtt_ns_p99, rtt_ns_p999, prober_delay_ns_p50, prober_delay_ns_p99,
           responder_delay_ns_p50, responder_delay_ns_p99,
           sla_violations, local_drop,
           CASE size(ts_names) WHEN 0 THEN NULL WHEN 1 THEN ts_names[0]
                ELSE concat('mixed(', array_join(ts_names, '+'), ')') END AS ts_source{service_out}
    FROM rows
    ORDER BY sla_violations = '', window_start_ns,
             {scope_rank_sql()}, entity
    """


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window-s", type=int, required=True, help="window length, seconds (as analyze's --window-s)")
    ap.add_argument("--input", required=True, help="analyze export's Parquet file, or a (Hive-partitioned) directory of them")
    ap.add_argument("--output", required=True, help="the report, one Parquet file")
    ap.add_argument("--scopes", default=",".join(SCOPES), help=f"comma-separated, of {', '.join(SCOPES)} (default: all)")
    ap.add_argument("--sla-loss", type=float, default=0.001, help="loss-ratio threshold (analyze's default)")
    ap.add_argument("--sla-rtt-p99-us", type=float, default=500.0, help="RTT p99 threshold, us (analyze's default)")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--shuffle-partitions", type=int, default=None, help="spark.sql.shuffle.partitions (Spark's default if unset)")
    args = ap.parse_args()
    if args.window_s < 1:
        ap.error("the window must be at least 1 s")
    scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
    bad = [s for s in scopes if s not in SCOPES]
    if bad or not scopes:
        ap.error(f"unknown scope(s) {bad}: this job computes {', '.join(SCOPES)}")

    t0 = time.perf_counter()
    builder = (
        SparkSession.builder.appName("rocemesh-sla-report")
        .master(args.master)
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        # Partition values are directory names: keep them strings (they are dropped anyway).
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if args.shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    print(f"start_s={time.perf_counter() - t0:.2f}", flush=True)

    t = time.perf_counter()
    probes = spark.read.parquet(args.input)
    probes = probes.drop(*[c for c in PARTITION_COLUMNS if c in probes.columns])
    if "service" in scopes:
        missing = [c for c in ("service_entity",) + tuple(c for c, _, _ in SERVICE_COLUMNS) if c not in probes.columns]
        # analyze export writes the connection columns only when the input defines a service:
        # without them and without a service probe, the service scope has no rows, as in analyze.
        traced = "service" not in probes.columns or probes.where("service IS NOT NULL").limit(1).count() > 0
        if missing and traced:
            sys.exit(
                f"{args.input}: no column(s) {', '.join(missing)}, which the service scope groups by: "
                "export the segments again with this release's `analyze export`, or leave out the service scope"
            )
        if missing:
            scopes = [s for s in scopes if s != "service"]
            if not scopes:
                sys.exit(f"{args.input}: no traced connection in the input, so the service scope has no rows; nothing written")
    probes.createOrReplaceTempView("probes")
    report = spark.sql(report_sql(args.window_s * 1_000_000_000, scopes, args.sla_loss, args.sla_rtt_p99_us))
    # One file, as analyze writes: the sorted rows in one partition, then the part file moved.
    tmp = args.output + ".spark-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    report.coalesce(1).write.mode("overwrite").parquet(tmp)
    parts = glob.glob(os.path.join(tmp, "part-*.parquet"))
    if len(parts) != 1:
        sys.exit(f"expected one part file in {tmp}, found {len(parts)}")
    os.replace(parts[0], args.output)
    shutil.rmtree(tmp)
    query_s = time.perf_counter() - t
    rows = spark.read.parquet(args.output).count()
    print(f"query_s={query_s:.3f} spark={spark.version} rows={rows}")
    spark.stop()


if __name__ == "__main__":
    main()
