"""The device model against published measurements: rehearse each, fit the efficiencies, print the table.

    python -m bench.rehearsal.calibration            # every point at its published size (minutes of CPU)
    python -m bench.rehearsal.calibration --quick    # each point scaled down (seconds): the machinery only
    python -m bench.rehearsal.calibration --only AIME25 --num-prompts 192   # some points, under the committed fit

Each POINT (bench/rehearsal/published.py) is a public measurement of vLLM on a GPU, restated as a plain workload
with what its source says (model, GPU, lengths, prompts, engine limits) and, where the source does not say,
an assumption written beside it. How much is assumed decides whether a point is fitted (``Point.stated``): the
fit takes the points whose workload is stated ("full") or whose assumption its figure barely depends on
("partial"); a point whose figure rests on an assumption ("assumed") is a check, as is one on a GPU the fit
does not cover. Each is rehearsed once; its schedule does not depend on the device's
speed (every request arrives at once, or as others finish), so the fit prices the same steps again under
other figures (``Features``, vectorised: the sum engine/device_model.py's step_cost makes, term by term) and
moves the Hopper efficiencies (FIT) to minimise the squared log-ratio of rehearsed to published. It prints
published vs rehearsed at the presets' figures and at the fitted ones, the ratio, and the residual (the
root-mean-square of the log-ratios, as a percentage). docs/rehearsal.md ("Calibration") has the table.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.config import positive_int
from engine.device_model import HOPPER_FITTED, PRESETS, DeviceParams

from bench.rehearsal import plain
from bench.rehearsal.checks import MAX_KV_TOKENS
from bench.rehearsal.published import LOWER_IS_BETTER, POINTS, Point
from bench.rehearsal.shapes import model_folder

# linear_bw_eff is held at the assumed figure: every point is an 8B model, so weight streaming and the step
# overhead are both a constant per step and the points fix only their sum (fitted together, the search crawled
# along that valley and weight streaming ran to its bound).
FIT = ("attention_bw_eff", "matmul_eff", "step_overhead_s")
BOUNDS = {"linear_bw_eff": (0.3, 1.0), "attention_bw_eff": (0.2, 1.0), "matmul_eff": (0.2, 1.0),
          "step_overhead_s": (1e-6, 3e-3), "prefill_attention_eff": (0.1, 1.0)}


def flags_of(point: Point, quick: bool, out: Path) -> argparse.Namespace:
    """plain.py's flags for a point (the rest at the rehearsal's defaults)."""
    flags = dict(device=point.device, shape=point.shape, n=1, max_concurrency=None, gpu_memory_utilization=0.9,
                 random_range_ratio=0.0,
                 max_model_len=None, max_kv_tokens=MAX_KV_TOKENS, self_draft=None, spec_acceptance=None, seed=0,
                 out=str(out)) | point.flags | (point.quick if quick else {})
    return argparse.Namespace(**flags)


@dataclass(slots=True)
class Features:
    """A trace's works as arrays, to price them under any device figures at once (plain.Trace)."""

    tokens: np.ndarray
    sampled: np.ndarray
    group_work: np.ndarray   # per decode group: its work, KV tokens read and stored, attention FLOPs
    group_kv: np.ndarray
    group_flops: np.ndarray
    chunk_work: np.ndarray   # per prefill chunk: its work, attention FLOPs, KV tokens read and stored
    chunk_flops: np.ndarray
    chunk_kv: np.ndarray
    step_of_work: np.ndarray
    steps: int

    @classmethod
    def of(cls, trace: plain.Trace, shape) -> "Features":
        from engine.device_model import attention_flops
        g = ([], [], [])
        c = ([], [], [])
        for i, w in enumerate(trace.works):
            for d in w.decodes:
                n = len(d.seq_lens)
                g[0].append(i)
                g[1].append(sum(d.seq_lens) - (n - 1) * d.cascade + d.num_queries)
                g[2].append(d.attention_flops(shape))
            for ch in w.prefills:
                c[0].append(i)
                c[1].append(attention_flops(shape, ch.start, ch.length))
                c[2].append(ch.start + 2 * ch.length)
        step_of = np.zeros(len(trace.works), dtype=np.int64)
        at = 0
        for s, b in enumerate(trace.bounds):
            step_of[at:b] = s
            at = b
        arr = lambda xs, t=float: np.asarray(xs, dtype=t)  # noqa: E731
        return cls(arr([w.num_tokens for w in trace.works]), arr([w.sampled for w in trace.works]),
                   arr(g[0], np.int64), arr(g[1]), arr(g[2]), arr(c[0], np.int64), arr(c[1]), arr(c[2]), step_of,
                   len(trace.bounds))

    def step_seconds(self, shape, dev: DeviceParams) -> np.ndarray:
        """Each engine step's modelled seconds: step_cost's total of each of its works, summed."""
        bw, peak = dev.hbm_bytes_per_s, dev.peak_flops
        weights = shape.weight_bytes / (bw * dev.linear_bw_eff)
        mm = (2.0 * shape.linear_params * self.tokens + 2.0 * shape.lm_head_params * self.sampled) / (peak * dev.matmul_eff)
        kv_s = shape.kv_bytes_per_token / (bw * dev.attention_bw_eff)
        attn = peak * dev.prefill_attention_eff
        t = np.maximum(weights, mm) + self.sampled * shape.vocab_size * 16 / bw + dev.step_overhead_s
        t += np.bincount(self.group_work, np.maximum(self.group_kv * kv_s, self.group_flops / attn), len(t))
        t += np.bincount(self.chunk_work, np.maximum(self.chunk_flops / attn, self.chunk_kv * kv_s), len(t))
        t[self.tokens == 0] = 0.0
        return np.bincount(self.step_of_work, t, self.steps)


def rehearse_points(points: list[Point], quick: bool, out: Path) -> list[tuple[Point, plain.Trace, object]]:
    """Each point rehearsed once: (point, its trace, its model shape)."""
    done = []
    for pt in points:
        print(f"rehearsing {pt.name} ...", file=sys.stderr)
        args = flags_of(pt, quick, out)
        from bench.rehearsal.__main__ import CONFIGS
        f = plain.run(args, model_folder(pt.shape, out / "model"), DeviceParams.named(pt.device), CONFIGS[pt.config]
                      if pt.config else None)
        done.append((pt, f["trace"], f["shape"]))
    return done


def evaluate(runs, devices: dict[str, DeviceParams]) -> list[float]:
    """Each point's rehearsed figure under ``devices`` (by the point's device name)."""
    out = []
    for pt, trace, shape, feats in runs:
        secs = feats.step_seconds(shape, devices[pt.device])
        out.append(plain.figures(trace, shape, devices[pt.device], list(secs))[pt.metric])
    return out


def residual(runs, values: list[float], keep=lambda pt: pt.fit) -> float:
    """The root-mean-square of log(rehearsed / published) over the points ``keep`` selects (by default the
    fitted ones), as a fraction (0.1: ~10%); nan when there are none."""
    logs = [math.log(v / pt.published) for (pt, *_), v in zip(runs, values) if keep(pt)]
    return math.sqrt(sum(x * x for x in logs) / len(logs)) if logs else math.nan


def fit(runs, start: DeviceParams, names=FIT) -> tuple[DeviceParams, float]:
    """The figures ``names`` that minimise the residual, the rest as ``start`` has them; with the residual
    they leave. A coordinate search in log space within BOUNDS: each figure in turn times e^+-step while that
    helps, the step halved when none does (deterministic; every evaluation re-prices the traces at once)."""
    def devices(x) -> dict[str, DeviceParams]:
        changes = dict(zip(names, x))
        return {k: dataclasses.replace(p, **changes) for k, p in PRESETS.items()} | {
            start.name: dataclasses.replace(start, **changes)}

    def loss(x) -> float:
        return residual(runs, evaluate(runs, devices(x)))

    x = [min(BOUNDS[n][1], max(BOUNDS[n][0], getattr(start, n))) for n in names]
    best, step = loss(x), 0.5
    while step > 1e-3:
        moved = False
        for i, n in enumerate(names):
            for sign in (1, -1):
                y = list(x)
                y[i] = min(BOUNDS[n][1], max(BOUNDS[n][0], x[i] * math.exp(sign * step)))
                value = loss(y)
                if value < best - 1e-12:
                    x, best, moved = y, value, True
        if not moved:
            step /= 2
    return devices(x)[start.name], best


def speed_ratio(pt: Point, value: float) -> float:
    """The modelled speed over the published one (> 1: the model is faster than the measurement)."""
    return pt.published / value if pt.metric in LOWER_IS_BETTER else value / pt.published


def _num(x: float) -> str:
    return f"{x:,.4g}" if x < 100 else f"{x:,.0f}" if x >= 10_000 else f"{x:,.1f}"


def table(runs, before: list[float], after: list[float]) -> str:
    head = ("| point | regime | hardware | published | rehearsed (presets) | speed ratio | rehearsed (fitted) | "
            "speed ratio | workload stated | in fit |")
    lines = [head, "|" + "---|" * 10]
    for (pt, *_), b, a in zip(runs, before, after):
        lines.append(f"| {pt.name} | {pt.regime} | {pt.hardware} | {_num(pt.published)} {pt.metric} | {_num(b)} | "
                     f"{speed_ratio(pt, b):.2f} | {_num(a)} | {speed_ratio(pt, a):.2f} | {pt.stated} | "
                     f"{'yes' if pt.fit else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rehearsal.calibration", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="each point scaled down: the machinery in seconds, no "
                   "meaningful figure")
    p.add_argument("--only", action="append", metavar="TEXT", help="only the points whose name holds TEXT "
                   "(repeatable); the fitted column then takes the committed fit (the -fitted presets) instead of a new one")
    p.add_argument("--num-prompts", type=positive_int, metavar="N", help="each point's prompts at most N: a sample of its "
                   "workload, where the whole is too long for the CPU at hand")
    p.add_argument("--out", default="runs/calibration")
    args = p.parse_args(argv)
    out = Path(args.out)
    points = [pt for pt in POINTS if not args.only or any(t in pt.name for t in args.only)]
    if not points:
        p.error(f"no point's name holds {args.only}; the points: {[pt.name for pt in POINTS]}")
    if args.num_prompts:
        points = [dataclasses.replace(pt, flags=pt.flags | {"num_prompts": min(args.num_prompts, pt.flags["num_prompts"])})
                  for pt in points]
    runs = [(pt, trace, shape, Features.of(trace, shape)) for pt, trace, shape in rehearse_points(points, args.quick, out)]
    before = evaluate(runs, dict(PRESETS))
    if args.only:
        committed = {k: dataclasses.replace(v, **{n: HOPPER_FITTED[n] for n in FIT}) for k, v in PRESETS.items()}
        print(table(runs, before, evaluate(runs, committed)))
        print("fitted: the committed fit (engine/device_model.py HOPPER_FITTED): "
              + ", ".join(f"{n}={HOPPER_FITTED[n]:.4g}" for n in FIT))
        return 0
    h100, res = fit(runs, PRESETS["h100"])
    after = evaluate(runs, {k: dataclasses.replace(v, **{n: getattr(h100, n) for n in FIT}) for k, v in PRESETS.items()})
    print(table(runs, before, after))
    n_fit = sum(pt.fit for pt, *_ in runs)
    aside = lambda pt: not pt.fit  # noqa: E731
    print(f"\nresidual (rms of log rehearsed/published) over the {n_fit} points fitted: presets "
          f"{100 * residual(runs, before):.1f}%, fitted {100 * res:.1f}%; over the {len(runs) - n_fit} kept aside: "
          f"presets {100 * residual(runs, before, aside):.1f}%, fitted {100 * residual(runs, after, aside):.1f}%")
    by = {k: [math.log(v / pt.published) ** 2 for (pt, *_), v in zip(runs, after) if pt.stated == k]
          for k in ("full", "partial", "assumed")}
    print("fitted figures, by how the workload is stated: " + "; ".join(
        f"{k} ({len(v)}) {100 * math.sqrt(sum(v) / len(v)):.1f}%" for k, v in by.items() if v))
    print("fitted: " + ", ".join(f"{n}={getattr(h100, n):.4g}" for n in FIT))
    # The same fit over the fitted points measured on a current vLLM only: how much of the residual is the
    # older engines' host work per step rather than the GPU.
    current = [r for r in runs if r[0].fit and r[0].vllm == "current"]
    if current:
        cur, res_cur = fit(current, PRESETS["h100"])
        after_cur = evaluate(runs, {k: dataclasses.replace(v, **{n: getattr(cur, n) for n in FIT})
                                    for k, v in PRESETS.items()})
        older = lambda pt: pt.fit and pt.vllm != "current"  # noqa: E731
        print(f"fit over the {len(current)} fitted points on a current vLLM only: residual {100 * res_cur:.1f}%; "
              f"with its figures, the older-vLLM fitted points {100 * residual(runs, after_cur, older):.1f}%, the "
              f"checks {100 * residual(runs, after_cur, aside):.1f}%; figures: "
              + ", ".join(f"{n}={getattr(cur, n):.4g}" for n in FIT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
