"""Draw a record file as a PNG: a ``pixpool monitor --record`` file, or a training run's
``results.jsonl``.

Runs in the operator's process (``pixpool plot``); needs matplotlib (the ``plot`` extra),
drawn off-screen (Agg).

- Memory record. Left: the service's memory over time by component (snapshot, batch rings,
  the daemon's and workers' own pages) with the trainers' own PSS on top. Right, from the
  last sample: what the service retains against one decoded uint8 cache and against one
  uint8 cache per attached trainer.
- Training results: losses (total and box/cls/dfl), validation mAP, learning rate and the
  share of time spent waiting for data, per epoch.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..shared.errors import ConfigError, MissingExtraError

_MIB = 1 << 20


def read_record(path: str | Path) -> list[dict]:
    """The lines of a record file, all of one kind (memory samples or training epochs);
    ConfigError names the file and line of a bad one."""
    samples = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                s = json.loads(line)
                if "epoch" in s:
                    float(s["loss"])
                else:
                    s["memory"]["service_pss_bytes"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(
                    f"{path}:{line_no}: not a `pixpool monitor --record` sample nor a results.jsonl epoch ({type(exc).__name__}: {exc})"
                ) from None
            if samples and ("epoch" in s) != ("epoch" in samples[0]):
                raise ConfigError(f"{path}:{line_no}: memory samples and training epochs mixed in one file")
            samples.append(s)
    if not samples:
        raise ConfigError(f"{path}: no samples; record some with `pixpool monitor --record {path}` or `pixpool train`")
    return samples


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtraError("pixpool plot needs matplotlib: pip install 'pixpool[plot]'") from None
    return plt


def plot_any(samples: list[dict], out: str | Path) -> Path:
    return plot_results(samples, out) if "epoch" in samples[0] else plot(samples, out)


def plot_results(rows: list[dict], out: str | Path, *, width_px: int = 1200, height_px: int = 800) -> Path:
    """Training curves from ``results.jsonl`` rows (one per epoch)."""
    plt = _pyplot()
    epochs = [r["epoch"] + 1 for r in rows]
    dpi = 100
    fig, axes = plt.subplots(2, 2, figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    ax = axes[0][0]
    for key in ("loss", "box", "cls", "dfl"):
        if all(key in r for r in rows):
            ax.plot(epochs, [r[key] for r in rows], marker="o", label=key)
    ax.set_title("training loss")
    ax.legend(fontsize="small")
    ax = axes[0][1]
    for key in ("mAP50", "mAP50_95"):
        if any(key in r for r in rows):
            ax.plot(epochs, [r.get(key, float("nan")) for r in rows], marker="o", label=key)
    ax.set_title("validation mAP")
    ax.legend(fontsize="small")
    axes[1][0].plot(epochs, [r["lr"] for r in rows], marker="o")
    axes[1][0].set_title("learning rate (end of epoch)")
    axes[1][1].plot(epochs, [100 * r["data_wait_fraction"] for r in rows], marker="o")
    axes[1][1].set_title("data wait, % of the epoch")
    for a in axes.flat:
        a.set_xlabel("epoch")
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def components(mem: dict) -> dict[str, float]:
    """MiB per component of one sample (they add up to total_pss_bytes)."""
    bases = tuple(b + "-" for b in mem.get("snapshots") or [mem["snapshot"]] if b)
    snapshot = sum(v["resident_bytes"] for k, v in mem["segments"].items() if bases and k.startswith(bases))
    rings = mem["ring_bytes"]
    own = max(0, mem["service_pss_bytes"] - snapshot - rings)
    return {
        "snapshot": snapshot / _MIB,
        "batch rings": rings / _MIB,
        "daemon + workers": own / _MIB,
        "trainers": mem["trainers_pss_bytes"] / _MIB,
    }


def plot(samples: list[dict], out: str | Path, *, width_px: int = 1200, height_px: int = 500) -> Path:
    """Memory over time and retained against decoded, from ``monitor --record`` samples."""
    plt = _pyplot()
    t0 = samples[0]["time_unix"]
    xs = [s["time_unix"] - t0 for s in samples]
    parts = [components(s["memory"]) for s in samples]
    names = list(parts[0])
    dpi = 100
    fig, (ax, bar) = plt.subplots(
        1, 2, figsize=(width_px / dpi, height_px / dpi), dpi=dpi, gridspec_kw={"width_ratios": [2.2, 1]}
    )
    ax.stackplot(xs, *[[p[n] for p in parts] for n in names], labels=names, alpha=0.85)
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB (PSS; each segment once)")
    ax.set_title("pixpool memory over time")
    ax.legend(loc="upper left", fontsize="small")
    last = samples[-1]["memory"]
    n = last["trainers"]
    labels = ["pixpool service", "one uint8 cache", f"uint8 cache x {n} trainer{'' if n == 1 else 's'}"]
    values = [last["service_pss_bytes"] / _MIB, last["decoded_bytes"] / _MIB, last["uint8_caches_bytes"] / _MIB]
    bar.bar(labels, values, color=["tab:blue", "tab:gray", "tab:orange"])
    bar.set_ylabel("MiB")
    k = last["break_even_trainers"]
    even = f"from {k} trainer{'' if k == 1 else 's'} on" if k else "n/a"
    bar.set_title(f"retained vs decoded (break-even: {even})", fontsize="medium")
    bar.tick_params(axis="x", labelsize="small", rotation=15)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out
