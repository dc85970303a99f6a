"""Compare two SLA report Parquet files (analyze report's and sla_report.py's) row by row.

Rows are keyed on (window_start_ns, scope, entity), whatever the scope (cluster, tor_pair, tor,
rnic, pair, service: the pair scopes' `from->to` entities and a connection's label are plain
strings too). The two files must hold the same keys (each once), every count and quantile must
be equal (nulls where the other has nulls), loss_ratio within 1e-12, and the columns both have
of local_drop, the text columns (window_start, sla_violations, ts_source) and the service
scope's connection columns (service, prober, remote, remote_resolution, comm; pid, local_qpn,
remote_qpn, flow_label) equal. Prints the number of rows compared, and how many of each scope
(`by scope: cluster=N, ...`, by name); exits 1 with the first 20 differences otherwise, and also
when either file is missing, unreadable, lacks a compared column or has no rows: a check that
finds nothing to compare has failed.

Usage: python compare.py ANALYZE.parquet SPARK.parquet
"""

import os
import sys

import pyarrow.parquet as pq

KEY = ("window_start_ns", "scope", "entity")
EXACT = (
    "probes", "ok", "lost", "partial", "invalid", "refused", "unreachable",
    "rtt_ns_p50", "rtt_ns_p99", "rtt_ns_p999", "prober_delay_ns_p50", "prober_delay_ns_p99",
    "responder_delay_ns_p50", "responder_delay_ns_p99",
)
OPTIONAL_EXACT = ("local_drop", "pid", "local_qpn", "remote_qpn", "flow_label")
TEXT = ("window_start", "sla_violations", "ts_source", "service", "prober", "remote", "remote_resolution", "comm")
LOSS_TOLERANCE = 1e-12


def fail(lines):
    print("\n".join(lines[:20]), file=sys.stderr)
    if len(lines) > 20:
        print(f"... and {len(lines) - 20} more", file=sys.stderr)
    sys.exit(1)


def load(path, columns):
    if not os.path.isfile(path):
        fail([f"{path}: no such file"])
    try:
        table = pq.read_table(path)
    except Exception as e:  # missing, unreadable, not Parquet
        fail([f"{path}: cannot read: {e}"])
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        fail([f"{path}: no column(s) {', '.join(missing)}"])
    if table.num_rows == 0:
        fail([f"{path}: no rows"])
    rows = {}
    data = {c: table.column(c).to_pylist() for c in columns}
    for i in range(table.num_rows):
        key = (int(data["window_start_ns"][i]), str(data["scope"][i]), str(data["entity"][i]))
        if key in rows:
            fail([f"{path}: row {key} twice"])
        rows[key] = {c: data[c][i] for c in columns}
    return table.column_names, rows


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a_path, b_path = sys.argv[1], sys.argv[2]
    a_cols = pq.read_schema(a_path).names if _exists(a_path) else []
    b_cols = pq.read_schema(b_path).names if _exists(b_path) else []
    extra = [c for c in OPTIONAL_EXACT + TEXT if c in a_cols and c in b_cols]
    columns = list(KEY) + ["loss_ratio"] + list(EXACT) + extra
    _, a = load(a_path, columns)
    _, b = load(b_path, columns)
    bad = []
    only_a, only_b = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
    if only_a or only_b:
        bad.append(
            f"row sets differ: {len(only_a)} only in {a_path}, {len(only_b)} only in {b_path}; "
            f"e.g. {only_a[:2]} / {only_b[:2]}"
        )
    for k in sorted(a.keys() & b.keys()):
        x, y = a[k], b[k]
        lx, ly = x["loss_ratio"], y["loss_ratio"]
        if (lx is None) != (ly is None) or (lx is not None and abs(lx - ly) > LOSS_TOLERANCE):
            bad.append(f"{k}: loss_ratio {lx} != {ly}")
        for c in EXACT + tuple(c for c in extra if c in OPTIONAL_EXACT):
            u, v = x[c], y[c]
            if (None if u is None else int(u)) != (None if v is None else int(v)):
                bad.append(f"{k}: {c} {u} != {v}")
        for c in (c for c in extra if c in TEXT):
            if x[c] != y[c]:
                bad.append(f"{k}: {c} {x[c]!r} != {y[c]!r}")
    if bad:
        fail(bad)
    by_scope = {}
    for _, scope, _ in a:
        by_scope[scope] = by_scope.get(scope, 0) + 1
    scopes = ", ".join(f"{s}={n}" for s, n in sorted(by_scope.items()))
    print(f"rows compared: {len(a)} (columns: {', '.join(columns[3:])}): all equal; by scope: {scopes}")


def _exists(path):
    try:
        pq.read_schema(path)
        return True
    except Exception:
        return False


if __name__ == "__main__":
    main()
