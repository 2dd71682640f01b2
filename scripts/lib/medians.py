"""Medians of the runs a compare script collected ($OUT/<label>.jsonl), as a table.

Shared by compare-bullmq.sh and compare-nats.sh (which import it from scripts/lib).
"""
import json
import os
import statistics

ROWS = [
    ("throughput req/s", "throughput_rps", None),
    ("tp p50 ms", "tp_p50_ms", None),
    ("tp p99 ms", "tp_p99_ms", None),
    ("lat p50 ms", "lat_p50_ms", None),
    ("lat p99 ms", "lat_p99_ms", None),
    ("redis cmds/req", "redis_cmds_per_req", None),
    ("redis µs/req", "redis_cpu_us_per_req", None),
    ("cpu machine %", "tp_cpu_pct", "machine"),
    ("cpu producer %", "tp_cpu_pct", "producer"),
    ("cpu worker %", "tp_cpu_pct", "worker"),
    ("cpu redis %", "tp_cpu_pct", "redis"),
    ("cpu other %", "tp_cpu_pct", "other"),
]


def load(out, labels):
    """The runs of each label."""
    runs = {}
    for label in labels:
        with open(os.path.join(out, label + ".jsonl")) as f:
            runs[label] = [json.loads(l) for l in f if l.strip()]
    return runs


def med(runs, label, key, sub=None):
    """The median of `key` (or `key`.`sub`) over a label's runs; None without values."""
    vals = []
    for r in runs[label]:
        v = r.get(key)
        if sub is not None:
            v = (v or {}).get(sub)
        if isinstance(v, (int, float)):
            vals.append(v)
    return statistics.median(vals) if vals else None


def fmt(v, key=""):
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:.0f}"
    if abs(v) >= 10 or key == "tp_cpu_pct":
        return f"{v:.1f}"
    if key == "redis_cmds_per_req":
        return f"{v:.2f}"
    return f"{v:.3f}"


def print_table(runs, n, labels, ratios):
    """One row per ROWS entry: each label's median, then each ratio (name, numerator
    label, denominator label)."""
    table = [["median of " + n + " runs"] + labels + [name for name, _, _ in ratios]]
    for name, key, sub in ROWS:
        m = {l: med(runs, l, key, sub) for l in labels}
        cells = [fmt(m[l], key) for l in labels]
        for _, num, den in ratios:
            x, y = m[num], m[den]
            cells.append("-" if x is None or not y else f"{x / y:.2f}x")
        table.append([name] + cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    print(rule)
    for i, r in enumerate(table):
        print("| " + " | ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))) + " |")
        if i == 0:
            print(rule)
    print(rule)


def noise_note(runs):
    """A line when some run was disturbed ('other' CPU over 10 % of a core)."""
    others = [r.get("tp_cpu_pct", {}).get("other") for rs in runs.values() for r in rs]
    others = [o for o in others if isinstance(o, (int, float))]
    if others and max(others) > 10:
        print(f"  note: 'other' CPU reached {max(others):.0f} % of a core in some run: the machine was busy, numbers are noisy")


def per_round(runs, ratios, key="throughput_rps"):
    """Each ratio (name, numerator label, denominator label) round by round: run i of the
    numerator against run i of the denominator, run minutes apart in the same round, so
    the machine's drift between rounds cancels. Printed as the rounds' ratios and their
    median, beside the table's ratios of medians (which the targets are read on)."""
    for name, num, den in ratios:
        xs = [a.get(key) / b.get(key) for a, b in zip(runs[num], runs[den])
              if isinstance(a.get(key), (int, float)) and b.get(key)]
        if xs:
            print(f"  per round, {name}: " + " ".join(f"{x:.2f}" for x in xs)
                  + f" (median {statistics.median(xs):.2f})")
