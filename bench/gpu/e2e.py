"""The engine end to end on a Qwen3-8B-shaped random bf16 checkpoint, YaRN to 131k: stages of the GPU
check (bench/gpu/check.sh runs it in parts with --only; a run keeps the sections of earlier runs into the
same --out, and --checkpoint lets them share one written checkpoint).

One file past 300 lines: every engine section of the GPU check is here (step timing: bench/gpu/step_times.py).

Sections (each is written to $OUT/gpu_e2e.json as soon as it ran, so a timeout keeps what ran):
- checkpoint: the random checkpoint written to --checkpoint (bench/gpu/checkpoint.py: a folder the check
  creates and marks, `complete` last; one it did not create is refused, never written into). The other
  sections never write it when --checkpoint is given: a cut write is reported, not redone in their time;
- throughput: round 1 (512-token prompts, n=32) and round 2 (16k prompts, n=4) decode tokens/s with
  cascade on and off, and past_64k (a 64k prompt, n=4), which decodes past position 65,535 and is
  checked against transformers there (--cases picks among them). Each decode step's time is split into
  schedule, prepare, sample and the GPU's forward (bench/gpu/step_times.py); "load" records the first
  engine's load (graph capture included), memory and KV tokens;
- spec: round 1's prompts decoded with self-drafting (fixed depth) and with n-gram drafts: the mean
  device time of a draft step, a verify step and a plain decode step (acceptance means nothing on
  random weights; the rehearsal's device model prices these steps);
- logits: one engine as it runs by default (cascade, CUDA graphs) against transformers loaded straight
  onto the device, teacher-forced on the engine's tokens (the rule: logits_check);
- hf: transformers `generate` at round 1's batch, the baseline the engine is compared to;
- fp8: round 1 and round 2 again (cascade on) with each --fp8 KV cache format.
If capturing the CUDA graphs fails (LLM() raises), the failure is recorded ("graph_capture_errors")
and that engine runs eagerly, so one capture bug does not cost the section's numbers.
Every engine and transformers model is dropped before the next loads; each section records the device
memory free when it starts and ends ("memory"). $OUT/device_params.json gets the engine's numbers next
to the kernels' (bench/gpu/kernels.py). The weights are random (shapes and dtype set the speed).

    python3 -m bench.gpu.e2e [--out DIR] [--only checkpoint,throughput,spec,logits,hf,fp8]
                             [--cases round1,round2,past_64k] [--fp8 fp8_e4m3,fp8_e5m2] [--checkpoint DIR]
    python3 -m bench.gpu.e2e --model DIR      # an existing checkpoint instead of a random one
    python3 -m bench.gpu.e2e --tiny           # CPU, a 2-layer model at tiny sizes: checks the code path
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.gpu.checkpoint import QWEN3_8B, TINY, checkpoint_folder
from bench.gpu.kernels import commit, write_device_params
from bench.gpu.logits import TOL, engine_logits, hf_model, hf_teacher_forced, logits_check, merge_checks
from bench.gpu.step_times import StepTimer

SECTIONS = ("checkpoint", "throughput", "spec", "logits", "hf", "fp8")
CASES = ("round1", "round2", "past_64k")



class Run:
    def __init__(self, args, device: str, dtype: str, shape: dict):
        self.args, self.device, self.dtype, self.shape = args, device, dtype, shape
        self.only = args.only.split(",")
        self.report: dict = dict(commit=commit(), dtype=dtype)
        path = Path(args.out or "") / "gpu_e2e.json"
        if args.out and path.is_file():  # an earlier stage's sections, unless this run redoes them
            redo = set(self.only) - {"throughput"}  # whose rows are redone case by case
            redo |= {f"{s}_error" for s in self.only} | ({"load"} if "throughput" in self.only else set())
            if "throughput" in self.only and "past_64k" in args.cases.split(","):
                redo.add("past_64k_logits")
            self.report = {k: v for k, v in json.loads(path.read_text()).items() if k not in redo}
            self.report.update(commit=commit(), dtype=dtype)

    def save(self, section: str, data) -> None:
        self.report[section] = data
        print(f"== {section}: {json.dumps(data[-1] if isinstance(data, list) else data)[:2000]}", flush=True)
        self._write()

    def _write(self) -> None:
        if self.args.out:
            Path(self.args.out).mkdir(parents=True, exist_ok=True)
            (Path(self.args.out) / "gpu_e2e.json").write_text(json.dumps(self.report, indent=1))

    def engine(self, **kw):
        """An LLM on the checkpoint; use it as `with run.engine(...) as llm:`, so that its memory is
        released (shutdown) before the next engine or model loads."""
        from engine import LLM
        return LLM(str(self.folder), dtype=self.dtype, device=self.device, record_steps=True, **kw)

    def open(self, label: str, record_load: bool = False, **kw):
        """run.engine(**kw); if capturing its CUDA graphs fails, the failure is recorded under
        graph_capture_errors and the same engine opens eagerly. record_load: save its load figures."""
        import torch
        if record_load and self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        failure = None
        try:
            llm = self.engine(**kw)
        except RuntimeError as e:
            if kw.get("enforce_eager") or "CUDA graphs failed" not in str(e):
                raise
            failure = str(e)
        if failure is not None:
            # Out of the `except` block: its traceback held the failed LLM() frames, and with them the model
            # and the KV cache (~16 GB + ~117 GB on an H200); the retry needs that memory back first.
            self.report.setdefault("graph_capture_errors", []).append(dict(engine=label, error=failure[:800]))
            self._write()
            print(f"== {label}: graph capture failed, running eagerly: {failure[:300]}", flush=True)
            self.free()
            t = time.perf_counter()
            llm = self.engine(**dict(kw, enforce_eager=True))
        if record_load:
            st, load_s = llm.stats(), time.perf_counter() - t
            weights = sum(p.numel() * p.element_size() for p in llm.runner.model.parameters())
            data = dict(load_s=load_s, graphs=llm.runner.graphs is not None, weights_GB=weights / 1e9,
                        kv_tokens=st["kv_blocks_total"] * llm.runner.block_size, kv_blocks=st["kv_blocks_total"],
                        kv_GB=st["kv_blocks_total"] * st["kv_bytes_per_block"] / 1e9)
            if self.device == "cuda":
                free, total = torch.cuda.mem_get_info()
                data.update(peak_allocated_GB=torch.cuda.max_memory_allocated() / 1e9, device_total_GB=total / 1e9,
                            device_free_GB=free / 1e9)
            self.save("load", data)
            write_device_params(self.args.out, engine=dict(load_s=load_s, weights_GB=data["weights_GB"],
                                                           kv_tokens=data["kv_tokens"]))
        return llm

    def free(self) -> None:
        """After the caller dropped its engine or model: collect, give the memory back to the device."""
        import torch
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def memory(self, label: str) -> None:
        """Print and record the device memory free now (where each section starts and ends)."""
        import torch
        if self.device != "cuda":
            entry = dict(at=label)
        else:
            free, total = torch.cuda.mem_get_info()
            entry = dict(at=label, free_GB=free / 1e9, total_GB=total / 1e9,
                         allocated_GB=torch.cuda.memory_allocated() / 1e9)
        print(f"== memory {json.dumps(entry)}", flush=True)
        self.report.setdefault("memory", []).append(entry)
        self._write()


def section_logits(run: Run) -> None:
    import torch
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, run.shape["vocab_size"], (2, 300), generator=g).tolist()
    n, gen = 4, 24
    # One engine as it runs by default (cascade on, CUDA graphs where there is CUDA); the other settings
    # are the tiny engine check's (bench/gpu/engine_check.py).
    with run.open("logits", cascade_attention=True, cascade_min_shared_tokens=0, num_kv_blocks=512,
                  max_num_seqs=8) as llm:
        graphs = llm.runner.graphs is not None
        children = engine_logits(llm, prompts, n, gen)
    del llm
    run.free()
    model = hf_model(run.folder, run.dtype, run.device)
    checks = [logits_check(rows, tokens, hf_teacher_forced(model, p, tokens), TOL[run.dtype])
              for p, tokens, rows in children]
    del model
    run.free()
    run.save("logits", dict(cascade=True, graphs=graphs, prompts=len(prompts), children=n, tokens=gen,
                            **merge_checks(checks)))


def _decode_rate(llm, prompts, n: int, gen: int) -> dict:
    """Generate; decode tokens/s over the decode steps, and where each step's time went (StepTimer)."""
    from engine import SamplingParams
    n0 = len(llm.step_log)
    t = time.perf_counter()
    with StepTimer(llm) as timer:
        outs = llm.generate(prompts, SamplingParams(n=n, max_tokens=gen, ignore_eos=True, temperature=0),
                            use_tqdm=False)
    wall = time.perf_counter() - t
    decode = [s for s in llm.step_log[n0:] if s.kind == "decode"]
    decode_s = sum(s.schedule_s + s.model_s + s.sample_s for s in decode)
    tokens = sum(len(o.token_ids) for r in outs for o in r.outputs)
    seqs = sum(len(r.outputs) for r in outs)  # each sequence's first token comes from its prefill step
    return dict(wall_s=wall, gen_tokens=tokens, e2e_tok_s=tokens / wall,
                decode_tok_s=(tokens - seqs) / decode_s if decode_s else 0.0,
                decode_steps=len(decode), cascade_steps=sum(s.cascade for s in decode),
                decode_ms_per_step=1e3 * decode_s / max(1, len(decode)), **timer.summary())


def _cases(tiny: bool) -> list[tuple]:
    """(name, prompt length, n, problems, generated tokens) of the throughput cases;
    past_64k: positions past 65,535 (tiny: past its YaRN original context, 1024)."""
    return [("round1", 64, 4, 2, 8), ("round2", 200, 3, 1, 8), ("past_64k", 1100, 2, 1, 8)] if tiny else \
        [("round1", 512, 32, 8, 128), ("round2", 16384, 4, 2, 128), ("past_64k", 65536, 4, 1, 64)]


def _prompts(run: Run, case: tuple) -> list[list[int]]:
    """A case's prompts: they depend on the case alone, so every engine and every stage decodes the same."""
    import torch
    name, plen, _, problems, _ = case
    g = torch.Generator().manual_seed(2 + CASES.index(name))
    return torch.randint(3, run.shape["vocab_size"], (problems, plen), generator=g).tolist()


def _measure(run: Run, llm, case: tuple, prompts=None, **marks) -> tuple[list, dict]:
    """One throughput case on llm (its prompts, or the given ones): (the prompts, its row)."""
    name, plen, n, problems, gen = case
    prompts = prompts or _prompts(run, case)
    # warm-up (compiles) on other tokens, so the prefix cache gives the measured run nothing
    _decode_rate(llm, [[(t * 7 + 1) % (run.shape["vocab_size"] - 3) + 3 for t in p[:64]] for p in prompts], n, 4)
    return prompts, dict(case=name, prompt_len=plen, n=n, problems=problems, **marks,
                         **_decode_rate(llm, prompts, n, gen), max_position=plen + gen - 1)


def _host_params(r: dict) -> dict:
    """device_params.json's figures of one measured row: ms per decode step by kind of forward, host share."""
    fw, steps = r.get("forwards", {}), r.get("steps", {})
    return dict(forward_ms={k: v["gpu_ms"] for k, v in fw.items()},
                forward_rows={k: v["rows"] for k, v in fw.items()},
                host_share={k: v["host_share"] for k, v in steps.items()})


def section_throughput(run: Run) -> None:
    cases = [c for c in _cases(run.args.tiny) if c[0] in run.args.cases.split(",")]
    rows = [r for r in run.report.get("throughput", []) if r["case"] not in run.args.cases.split(",")]
    long_check = None
    for cascade in (True, False):
        with run.open(f"throughput cascade={cascade}", record_load=cascade, cascade_attention=cascade,
                      max_num_seqs=256) as llm:
            for case in cases:
                name, _, _, _, gen = case
                prompts, r = _measure(run, llm, case, cascade=cascade, kv_dtype=llm.stats()["kv_cache_dtype"],
                                      graphs=llm.runner.graphs is not None)
                rows.append(r)
                run.save("throughput", rows)
                key = f"{name}_cascade" if cascade else f"{name}_paged"
                write_device_params(run.args.out, engine=dict(decode_tok_s={key: r["decode_tok_s"]},
                                                              steps={key: _host_params(r)}))
                if name == "past_64k" and cascade:  # the long-context decodes, checked after this engine is freed
                    long_check = engine_logits(llm, prompts[:1], 1, gen)[0]
        del llm
        run.free()
    if long_check is not None:
        model = hf_model(run.folder, run.dtype, run.device)
        prompt, tokens, eng_rows = long_check
        cmp = logits_check(eng_rows, tokens, hf_teacher_forced(model, prompt, tokens), TOL[run.dtype])
        del model
        run.free()
        run.save("past_64k_logits", dict(first_position=len(prompt), last_position=len(prompt) + len(tokens) - 1,
                                         **cmp))


def section_spec(run: Run) -> None:
    """Round 1's shape (fewer problems, fewer tokens) with self-drafting and with n-gram drafts: the device
    time of a draft, a verify and a plain decode step. The n-gram prompts repeat one segment, so that
    drafts are found (on random weights what follows is rarely accepted: the step times are the figure)."""
    case = ("round1", 64, 4, 1, 12) if run.args.tiny else ("round1", 512, 32, 2, 32)
    window = dict(method="self_window", num_speculative_tokens=3, window=16 if run.args.tiny else 256,
                  sink=4 if run.args.tiny else 16, policy="fixed")
    ngram = dict(method="ngram", num_speculative_tokens=4, prompt_lookup_min=1)
    seg = _prompts(run, case)[0][:32]
    repeated = [(seg * (case[1] // len(seg) + 1))[:case[1]] for _ in range(case[3])]
    rows = []
    for label, spec, prompts in (("self_window", window, None), ("ngram", ngram, repeated)):
        with run.open(f"spec {label}", cascade_attention=True, max_num_seqs=case[2] * case[3],
                      speculative_config=spec) as llm:
            _, r = _measure(run, llm, case, prompts=prompts, method=label, spec=spec,
                            graphs=llm.runner.graphs is not None)
        del llm
        run.free()
        rows.append(r)
        run.save("spec", rows)
        write_device_params(run.args.out, engine=dict(steps={f"spec_{label}": _host_params(r)}))


def section_hf(run: Run) -> None:
    import torch
    tiny = run.args.tiny
    plen, batch, gen = (64, 8, 8) if tiny else (512, 256, 64)  # round 1's batch: 8 problems x 32
    model = hf_model(run.folder, run.dtype, run.device)
    ids = torch.randint(3, run.shape["vocab_size"], (batch, plen), generator=torch.Generator().manual_seed(3))
    ids = ids.to(run.device)
    kw = dict(max_new_tokens=gen, min_new_tokens=gen, do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:, :16], **dict(kw, max_new_tokens=2, min_new_tokens=2))  # warm-up
        t = time.perf_counter()
        model.generate(ids, **kw)
        if run.device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
    del model, ids
    run.free()
    data = dict(prompt_len=plen, batch=batch, gen=gen, wall_s=wall, tok_s=batch * gen / wall)
    r1 = next((r for r in run.report.get("throughput", []) if r["case"] == "round1" and r["cascade"]), None)
    if r1:
        data["engine_round1_decode_tok_s"] = r1["decode_tok_s"]
        data["engine_vs_hf"] = r1["decode_tok_s"] / data["tok_s"]
    run.save("hf", data)
    write_device_params(run.args.out, engine=dict(hf_generate_tok_s=data["tok_s"], engine_vs_hf=data.get("engine_vs_hf")))


def section_fp8(run: Run) -> None:
    auto = {r["case"]: r for r in run.report.get("throughput", []) if r["cascade"]}
    rows = []
    for fmt in run.args.fp8.split(","):
        with run.open(f"fp8 {fmt}", cascade_attention=True, max_num_seqs=256, kv_cache_dtype=fmt) as llm:
            st = llm.stats()  # the format the engine reports, so a flag it ignored would show
            kv_tokens = st["kv_blocks_total"] * llm.runner.block_size
            write_device_params(run.args.out, engine={f"kv_tokens_{fmt}": kv_tokens})
            for case in _cases(run.args.tiny)[:2]:  # round 1's and round 2's prompts of the throughput section
                _, r = _measure(run, llm, case, cascade=True, kv_dtype=st["kv_cache_dtype"], kv_tokens=kv_tokens,
                                kv_bytes_per_token=st["kv_bytes_per_token"], graphs=llm.runner.graphs is not None)
                if r["case"] in auto:
                    r["decode_vs_auto"] = r["decode_tok_s"] / auto[r["case"]]["decode_tok_s"]
                rows.append(r)
                run.save("fp8", rows)
                write_device_params(run.args.out,
                                    engine={f"decode_tok_s_{fmt}": {f"{r['case']}_cascade": r["decode_tok_s"]}})
        del llm
        run.free()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny model and sizes (a check of the code path)")
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="folder for gpu_e2e.json")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--cases", default=",".join(CASES), help=f"the throughput section's cases, of {','.join(CASES)}")
    ap.add_argument("--model", default=None, help="an existing checkpoint folder instead of writing one")
    ap.add_argument("--checkpoint", default=None,
                    help="where the random checkpoint is written once and then reused (default: a new temp folder)")
    ap.add_argument("--fp8", default="fp8_e4m3", help="KV cache formats of the fp8 section (fp8_e4m3, fp8_e5m2)")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.only.split(",")) - set(SECTIONS)) + sorted(set(args.cases.split(",")) - set(CASES))
    if unknown:
        ap.error(f"unknown section or case {unknown}: --only takes {','.join(SECTIONS)}, --cases {','.join(CASES)}")
    import torch
    if args.tiny:
        run = Run(args, "cpu", "float32", TINY)
    elif not torch.cuda.is_available():
        print("gpu_e2e: no CUDA device (use --tiny on CPU)", file=sys.stderr)
        return 2
    else:
        run = Run(args, "cuda", "bfloat16", QWEN3_8B)
    t = time.perf_counter()
    if args.model:
        run.folder = Path(args.model)
    else:
        folder = Path(args.checkpoint) if args.checkpoint else Path(tempfile.mkdtemp(prefix="pacore_e2e_")) / "qwen3"
        try:  # with --checkpoint only the checkpoint section writes it (a cut write is not redone silently)
            run.folder = checkpoint_folder(folder, run.shape, run.dtype, run.device,
                                           write="checkpoint" in run.only or not args.checkpoint)
        except (FileNotFoundError, PermissionError, ValueError) as e:
            run.save("checkpoint_error", str(e))
            print(f"gpu_e2e: {e}", file=sys.stderr)
            return 1
    if "checkpoint" in run.only:
        run.save("checkpoint", dict(write_s=time.perf_counter() - t, folder=str(run.folder)))
    status = 0
    for name in SECTIONS[1:]:
        if name not in run.only:
            continue
        run.memory(f"{name} start")
        try:
            globals()[f"section_{name}"](run)
        except Exception as e:  # one failing section must not cost the others' numbers
            status = 1
            run.save(f"{name}_error", f"{type(e).__name__}: {e}"[:1000])
        run.free()  # what a failed section held too (its traceback is gone by now)
        run.memory(f"{name} end")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
