"""The serving sweep's two PNGs: output throughput against latency, and TTFT percentiles by concurrency."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt


def _by_system(rows: Sequence[dict]) -> Dict[str, List[dict]]:
    systems: Dict[str, List[dict]] = {}
    for row in rows:
        systems.setdefault(row["system"], []).append(row)
    return {name: sorted(rs, key=lambda r: r["concurrency"]) for name, rs in systems.items()}


def throughput_latency(rows: Sequence[dict], title: str, out: Path) -> Path:
    """Median ITL and median end-to-end latency against output tok/s, one line per system, points labelled with
    their concurrency."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, rs in _by_system(rows).items():
        x = [r["output_tok_s"] for r in rs]
        for ax, key in zip(axes, ("itl_ms_p50", "e2e_s_p50")):
            ax.plot(x, [r[key] for r in rs], marker="o", label=name)
            for r in rs:
                ax.annotate(str(r["concurrency"]), (r["output_tok_s"], r[key]), textcoords="offset points",
                            xytext=(4, 4), fontsize=7)
    for ax, label in zip(axes, ("median inter-token latency (ms)", "median end-to-end latency (s)")):
        ax.set_xlabel("output tokens/s (whole server)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}\n(labels: concurrent streams)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def ttft_percentiles(rows: Sequence[dict], title: str, out: Path) -> Path:
    """TTFT p50 / p90 / p99 against concurrency (log scale), one colour per system."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (name, rs) in enumerate(_by_system(rows).items()):
        c = [r["concurrency"] for r in rs]
        for p, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
            ax.plot(c, [r[f"ttft_ms_{p}"] for r in rs], linestyle=style, marker="o", color=f"C{i}", label=f"{name} {p}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("time to first token (ms)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def breakdown(rows: Sequence[dict], title: str, out: Path) -> Path:
    """MILI's engine thread by concurrency, served (light client) beside offline: the share of the wall time in
    prefill steps, decode steps, host work around them (schedule, sample, output, deliver) and the rest, with the
    event loop's CPU (cores) marked on the served bars."""
    parts = [("prefill", ("prefill_share",)), ("decode", ("decode_share",)),
             ("host", ("schedule_share", "sample_share", "output_share", "deliver_share")),
             ("idle or untimed", ("idle_share",))]
    served = {r["concurrency"]: r for r in rows if r["client"] != "offline"}
    offline = {r["concurrency"]: r for r in rows if r["client"] == "offline"}
    concurrencies = sorted(set(served) | set(offline))
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.38
    for shift, side, hatch in ((-width / 2, served, ""), (width / 2, offline, "//")):
        xs = [i + shift for i, c in enumerate(concurrencies) if c in side]
        bottom = [0.0] * len(xs)
        for j, (label, keys) in enumerate(parts):
            heights = [sum(side[c][k] for k in keys) for c in concurrencies if c in side]
            ax.bar(xs, heights, width, bottom=bottom, color=f"C{j}", hatch=hatch, edgecolor="white",
                   label=label if side is served else None)
            bottom = [b + h for b, h in zip(bottom, heights)]
    loop = [(i - width / 2, served[c]["loop_cpu"]) for i, c in enumerate(concurrencies) if c in served]
    if loop:
        ax.plot(*zip(*loop), "kD", label="event loop CPU (cores), served")
    ax.set_xticks(range(len(concurrencies)), [f"{c}\nserved | offline" for c in concurrencies], fontsize=8)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("share of the engine thread's wall time")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
