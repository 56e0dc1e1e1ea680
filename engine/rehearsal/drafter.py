"""The rehearsal's drafter: speculative drafts whose acceptance follows a measured profile.

A real drafter's acceptance depends on the text, which a rehearsal does not have: its trajectories
are scripted (runner.py's ScriptedSampler). So for each decode row this drafter draws whether the row
has a draft (the profile's ``draft_rate``), how long it is (``draft_len``) and how many of its tokens
the target accepts (``accept[j]``: the chance token j is accepted once the ones before it were),
then proposes the script's next tokens for the accepted ones and a wrong token after them. The
engine's own verification (engine/spec/verify.py) then keeps exactly those, as it would keep a real
drafter's; the scheduler, the drafts' blocks (rejected ones trimmed), the model runner's verify rows
and the device model's cost of each verify step all run for real.

Profiles come from ``bench/spec_acceptance.py`` (the embedded 135M model: far less predictable than
an 8B reasoning model) or are flat (``DraftProfile.flat``: the textbook i.i.d. acceptance).

Self-drafting (method "self_window") drafts with the model itself: the engine's own self_draft runs
its draft steps (RehearsalRunner.run_draft charges each) and ``ScriptedSelfDrafts`` is their sampler:
how many of a row's drafts the target accepts is drawn from the acceptance by position at the row's
context (``WindowProfile``, from ``bench/spec_self_acceptance.py``, by default capped by the published
long-context figures: ``WindowProfile.capped``; with ``selected`` blocks, ``sparse_profile``), and the draft
steps propose the script's tokens that far and a wrong one after. Every row drafts the depth the policy chose.
"""
from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.jsonfile import read_json

if TYPE_CHECKING:
    from engine.rehearsal.runner import ScriptedSampler
    from engine.core.sequence import Sequence

KINDS = ("round1", "round2")  # a round's prompt: the problem alone, or the problem and its references


@dataclass(slots=True, frozen=True)
class DraftProfile:
    """How often a row drafts, how long its drafts are, and how much of them the target accepts."""

    draft_rate: float              # P(a decode row has a draft in a step)
    draft_len: tuple[float, ...]   # [k]: P(a draft has k + 1 tokens)
    accept: tuple[float, ...]      # [j]: P(draft token j is accepted | the tokens before it were)

    @classmethod
    def flat(cls, p: float, k: int) -> "DraftProfile":
        """Every row drafts k tokens, each accepted with probability p once the ones before it were:
        (1 - p^(k+1)) / (1 - p) tokens per verify step (Leviathan et al., 2023)."""
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"a per-token acceptance must be in [0, 1], got {p}")
        return cls(1.0, (0.0,) * (k - 1) + (1.0,), (p,) * k)

    @classmethod
    def from_dict(cls, raw: dict) -> "DraftProfile":
        return cls(float(raw["draft_rate"]), tuple(map(float, raw["draft_len"])), tuple(map(float, raw["accept"])))

    def tokens_per_step(self) -> float:
        """Expected tokens a decode row emits per step (1 without a draft)."""
        cum = list(itertools.accumulate(self.accept, lambda x, y: x * y))  # [j]: P(tokens 0..j accepted)
        per_draft = sum(p * (1 + sum(cum[:k + 1])) for k, p in enumerate(self.draft_len))
        return 1 - self.draft_rate + self.draft_rate * per_draft


def load_profiles(path: str | Path, num_speculative_tokens: int, temperature: float) -> dict[str, DraftProfile]:
    """{"round1": ..., "round2": ...}: the profiles a ``bench/spec_acceptance.py`` JSON holds for
    ``num_speculative_tokens``, at the measured temperature nearest ``temperature``."""
    raw = read_json(path)
    by_temp = raw.get("profiles") or {}
    if not by_temp:
        raise ValueError(f"{path}: no 'profiles' in it; write one with python -m bench.spec_acceptance")
    t = min(by_temp, key=lambda key: abs(float(key) - temperature))
    out = {}
    for kind in KINDS:
        table = by_temp[t].get(kind, {})
        if str(num_speculative_tokens) not in table:
            raise ValueError(f"{path}: no {kind} profile for num_speculative_tokens={num_speculative_tokens} at "
                             f"temperature {t} (it has {sorted(table, key=int)}); measure it with python -m "
                             f"bench.spec_acceptance --num-speculative-tokens ...")
        out[kind] = DraftProfile.from_dict(table[str(num_speculative_tokens)])
    return out


class ScriptedDrafter:
    """Proposes as engine/spec/ngram.py's NgramDrafter does (``propose(seq, k)``), from the profile of
    the row's round kind (``kind_of(request_id)``), against the scripted trajectory. Seeded: the same
    schedule draws the same drafts."""

    def __init__(self, profiles: dict[str, DraftProfile], script: ScriptedSampler,
                 kind_of: Callable[[str], str] = lambda request_id: "round1", seed: int = 0):
        self.profiles, self.script, self.kind_of = profiles, script, kind_of
        self.rng = random.Random(seed)
        self._cdf = {kind: list(itertools.accumulate(p.draft_len)) for kind, p in profiles.items()}

    def propose(self, seq: Sequence, k: int) -> tuple[list[int], str]:
        kind = self.kind_of(seq.request.request_id)
        prof, rng = self.profiles[kind], self.rng
        if rng.random() >= prof.draft_rate:
            return [], ""
        cdf = self._cdf[kind]
        d = min(k, 1 + min(bisect.bisect_right(cdf, rng.random() * cdf[-1]), len(cdf) - 1))
        a = _accepted(rng, prof.accept[:d])
        g = seq.num_generated
        draft = [self.script.token(seq, g + j) for j in range(d)]
        if a < d:  # the first rejected token: anything but the script's
            draft[a] = _other(draft[a], self.script.vocab)
        return draft, "scripted"


def _accepted(rng: random.Random, accept) -> int:
    """How many leading drafts the target accepts: draft j with chance accept[j] once the ones before were."""
    a = 0
    while a < len(accept) and rng.random() < accept[a]:
        a += 1
    return a


def _other(token: int, vocab: int) -> int:
    return token + 1 if token + 1 < vocab else token - 1


# The published acceptance of a sink + window draft over a long context: MagicDec (Sadhukhan et al., arXiv
# 2408.11049, its StreamingLLM draft with a 512-token KV budget), Llama-3.1-8B on PG-19, greedy, the mean
# per-token acceptance at 4k / 8k / 16k / 32k / 64k / 100k of context. (context, acceptance), ascending.
MAGICDEC_STREAMINGLLM_512 = ((4096, 0.84), (8192, 0.83), (16384, 0.82), (32768, 0.81), (65536, 0.79),
                             (100_000, 0.79))


@dataclass(slots=True, frozen=True)
class WindowProfile:
    """Self-drafting's acceptance by position, per context bin: ``accept[i]`` holds for contexts up to
    ``bounds[i]`` tokens (the last bin for any longer one; ``capped`` bounds a measured profile by the published
    long-context figures and reads those past the measured contexts)."""

    bounds: tuple[int, ...]
    accept: tuple[tuple[float, ...], ...]

    @classmethod
    def flat(cls, p: float, k: int) -> "WindowProfile":
        """Every draft token accepted with probability p once the ones before it were, at any context."""
        DraftProfile.flat(p, k)  # the same range check
        return cls((1 << 62,), ((p,) * k,))

    def at(self, context: int) -> tuple[float, ...]:
        return self.accept[min(bisect.bisect_left(self.bounds, context), len(self.bounds) - 1)]

    def capped(self, curve: tuple[tuple[int, float], ...] = MAGICDEC_STREAMINGLLM_512) -> "WindowProfile":
        """This profile where it was measured, each position at most the published per-token acceptance
        ``curve`` gives at that context; past the last measured context the published curve alone (a
        measured bin is not read flat beyond the contexts it saw). A context between two published ones
        takes the figure of the next one up (the lower: acceptance falls with context), one below the
        first published context the first figure, one past the last the last."""
        measured_end = self.bounds[-1]
        bounds = sorted({b for b in self.bounds} | {c for c, _ in curve if c > measured_end})
        out = []
        for b in bounds:
            cap = next((p for c, p in curve if c >= b), curve[-1][1])
            if b <= measured_end:
                out.append(tuple(min(a, cap) for a in self.at(b)))
            else:
                out.append((cap,) * len(self.accept[-1]))
        return WindowProfile(tuple(bounds[:-1]) + (1 << 62,), tuple(out))


# The published gain of query-aware selection over a sink + window at the same KV budget: the Vegas poster
# (platformxlab/vegas, arXiv 2602.07223), Qwen3-8B on AIME25 at ~10k of context, 6 drafts: 5.43 tokens per
# iteration for Quest-style selection against 4.92 for StreamingLLM.
VEGAS_QUEST_OVER_STREAMING = 5.43 / 4.92


def _tokens_per_verify(accept) -> float:
    """Expected tokens a verify step emits when every row drafts len(accept) tokens."""
    return 1 + sum(itertools.accumulate(accept, lambda x, y: x * y))


def _raised(accept: tuple[float, ...], ratio: float) -> tuple[float, ...]:
    """``accept`` times one factor, each position at most 1, the factor chosen (by bisection) so that the
    tokens per verify step at this depth are ``ratio`` times ``accept``'s (all 1 when that is more than the
    depth allows). The ratios are measured and published on tokens per step, not per token."""
    target = ratio * _tokens_per_verify(accept)
    if target >= len(accept) + 1:
        return (1.0,) * len(accept)
    lo, hi = 0.0, 1.0 / max(min(accept), 1e-9)
    for _ in range(60):
        mid = (lo + hi) / 2
        if _tokens_per_verify(tuple(min(1.0, a * mid) for a in accept)) < target:
            lo = mid
        else:
            hi = mid
    return tuple(min(1.0, a * lo) for a in accept)


def sparse_profile(window: WindowProfile, ratios: tuple[tuple[int, float], ...],
                   curve: tuple[tuple[int, float], ...] = MAGICDEC_STREAMINGLLM_512,
                   published_ratio: float = VEGAS_QUEST_OVER_STREAMING) -> WindowProfile:
    """Sparse self-drafting's acceptance (speculative_config ``selected`` > 0), from ``window``: the profile
    of a sink + window that reads the same KV per draft step (window + selected tokens; by default capped:
    ``WindowProfile.capped``). ``ratios`` are the measured (context upper bound, sparse / window tokens per
    verify step) of the embedded model, ascending (``load_self_sparse``): in a measured bin the window's
    acceptance is raised by that bin's ratio (``_raised``). Past the last measured context, no measurement
    says more than the published one: the window raised by at most ``published_ratio`` (Vegas: Quest-style
    over StreamingLLM) and never above ``curve``'s figure (MagicDec's window) raised by it, so the profile is
    never flatter than the published curve. Every figure at most 1."""
    measured_end = ratios[-1][0]
    out = []
    for b in window.bounds:
        if b <= measured_end:
            ratio = next(r for c, r in ratios if c >= b)
            out.append(_raised(window.at(b), ratio))
        else:
            p = next((q for c, q in curve if c >= b), curve[-1][1])
            cap = _raised((p,) * len(window.at(b)), published_ratio)
            out.append(tuple(min(a, c) for a, c in zip(_raised(window.at(b), published_ratio), cap)))
    return WindowProfile(window.bounds, tuple(out))


def _section_bins(path: str | Path, section: str, rule: str, temperature: float, key: str | Callable, what: str,
                  measure: str) -> list[dict]:
    """The context bins of one entry of a profile JSON's ``section`` (self_window, self_sparse, self_verify,
    self_layerskip): the rule's figures for ``key`` (or the key ``key(section, keys)`` picks) at the measured
    temperature nearest ``temperature``, ascending by context."""
    raw = read_json(path).get(section)
    if not raw or not raw.get("profiles"):
        raise ValueError(f"{path}: no {section} profile in it; write one with {measure}")
    by_temp = raw["profiles"]
    t = min(by_temp, key=lambda k: abs(float(k) - temperature))
    if rule not in by_temp[t]:
        raise ValueError(f"{path}: no {section} profile for the rule {rule!r} (it has {sorted(by_temp[t])})")
    if callable(key):
        key = key(raw, by_temp[t][rule])
    if key not in by_temp[t][rule]:
        raise ValueError(f"{path}: no {section} profile for {what} (it has "
                         f"{sorted(by_temp[t][rule], key=lambda k: tuple(map(int, k.split()[0].split('/'))))}); measure it "
                         f"with {measure}")
    return sorted(by_temp[t][rule][key], key=lambda b: b["context"][1])


def load_self_sparse(path: str | Path, window: int, selected: int, sink: int, rule: str, temperature: float,
                     depth: int = 6, section: str = "self_sparse") -> tuple[tuple[int, float], ...]:
    """The measured (context upper bound, sparse / window tokens per verify step at ``depth`` drafts) of a
    profile JSON's self_sparse section (blocks chosen by key bounds) or self_verify section (by the last verify
    pass: selection "verify"), both written by ``python -m bench.spec_sparse_acceptance``, for this window,
    selected and sink against the window alone at the same read, at the temperature nearest ``temperature``;
    ascending by context."""
    bins = _section_bins(path, section, rule, temperature, f"{window}/{selected}/{sink}",
                         f"window {window}, selected {selected} and sink {sink}", "python -m bench.spec_sparse_acceptance")
    return _ratios(bins, depth)


def _ratios(bins: list[dict], depth: int) -> tuple[tuple[int, float], ...]:
    """(context upper bound, second / first tokens per verify step at ``depth`` drafts) of each bin."""
    ratios = []
    for b in bins:
        base, other = b["tokens_per_verify"][str(depth)]
        ratios.append((int(b["context"][1]), float(other) / float(base)))
    return tuple(ratios)


def load_self_layerskip(path: str | Path, layers: int, total: int, window: int, sink: int, rule: str,
                        temperature: float, depth: int = 6) -> tuple[tuple[int, float], ...]:
    """The measured (context upper bound, layer-skip / full-depth tokens per verify step at ``depth`` drafts) of a
    profile JSON's self_layerskip section (``python -m bench.spec_layerskip_acceptance`` writes it) at this
    window and sink, from the measured model's entry keeping the largest share of its layers that is at most
    ``layers`` / ``total`` (a draft of the model rehearsed keeps at least as many: never a better ratio than it
    would measure); ascending by context."""
    def pick(raw: dict, entries: dict) -> str | None:
        measured = raw.get("layers")
        shares = {k: int(k.split("/")[0]) / int(k.split("/")[1]) for k in entries
                  if " " not in k and (measured is None or int(k.split("/")[1]) == measured)}
        fit = [k for k, f in shares.items() if f <= layers / total + 1e-9]
        return max(fit, key=shares.get) if fit else f"{layers}/{total}"
    bins = _section_bins(path, "self_layerskip", rule, temperature, pick, f"a share of the layers at most {layers}/{total}",
                         "python -m bench.spec_layerskip_acceptance --keep ...")
    bins = [b for b in bins if b.get("window", f"{window}/{sink}") == f"{window}/{sink}"]
    if not bins:
        raise ValueError(f"{path}: no self_layerskip profile at window {window} and sink {sink}; measure it with "
                         f"python -m bench.spec_layerskip_acceptance --windows {window}/{sink}")
    return _ratios(bins, depth)


def layerskip_profile(window: WindowProfile, ratios: tuple[tuple[int, float], ...]) -> WindowProfile:
    """Layer-skip self-drafting's acceptance (speculative_config ``draft_layers``): the full-depth ``window``
    profile scaled by the measured layer-skip / full-depth ratio of each measured bin, and past the measured
    contexts by the last bin's; every ratio at most 1 (a draft of fewer layers is never taken to accept more
    than the full model's)."""
    capped = tuple((c, min(1.0, r)) for c, r in ratios)
    return sparse_profile(window, capped, published_ratio=capped[-1][1])


def load_self_window(path: str | Path, window: int, sink: int, rule: str, temperature: float) -> WindowProfile:
    """The self_window section of a profile JSON (``python -m bench.spec_self_acceptance`` writes it) for
    this window, sink and acceptance rule, at the measured temperature nearest ``temperature``."""
    bins = _section_bins(path, "self_window", rule, temperature, f"{window}/{sink}", f"window {window} and sink {sink}",
                         "python -m bench.spec_self_acceptance --windows ... --sinks ...")
    return WindowProfile(tuple(b["context"][1] for b in bins), tuple(tuple(map(float, b["accept"])) for b in bins))


class ScriptedSelfDrafts:
    """Self-drafting's draws in a rehearsal (Speculator.draft_sampler): at a row's first draft step of a
    verify step, how many of its drafts the target will accept is drawn from the profile at the row's
    context; its draft steps then propose the script's tokens that far and a wrong one after. Seeded."""

    def __init__(self, profile: WindowProfile, script: ScriptedSampler, seed: int = 0):
        self.profile, self.script = profile, script
        self.rng = random.Random(seed)
        self._runs: dict[int, int] = {}  # seq id -> drafts its verify step will accept

    def keys(self, seqs, offsets=None):
        return self.script.keys(seqs, offsets)

    def random_keys(self, n: int):
        return self.script.random_keys(n)

    def __call__(self, logits, seqs: list[Sequence], offsets: list[int] | None = None, keys=None) -> list[int]:
        out = []
        for s, j in zip(seqs, offsets or [0] * len(seqs)):
            if j == 0:
                self._runs[s.seq_id] = _accepted(self.rng, self.profile.at(s.num_computed + 1))
            t = self.script.token(s, s.num_generated + j)
            out.append(_other(t, self.script.vocab) if j == self._runs[s.seq_id] else t)
        return out


def use_scripted_drafter(llm, profiles: dict[str, DraftProfile], kind_of: Callable[[str], str] = lambda rid: "round1",
                         seed: int = 0) -> ScriptedDrafter:
    """Give a rehearsed LLM (``device_model=...``, ``speculative_config=...``) a ScriptedDrafter in place
    of its n-gram drafter; its drafts are counted under the corpus "scripted" in LLM.stats()."""
    spec = llm.speculator
    if spec is None or not hasattr(llm.sampler, "plan_for"):
        raise ValueError("a scripted drafter needs a rehearsed LLM with speculative decoding: "
                         "LLM(..., device_model='h200', speculative_config={'method': 'ngram', ...})")
    spec.drafter = drafter = ScriptedDrafter(profiles, llm.sampler, kind_of, seed)
    spec.stats.by_corpus.setdefault("scripted", [0, 0, 0])
    return drafter


def use_scripted_self_drafts(llm, profile: WindowProfile, seed: int = 0) -> ScriptedSelfDrafts:
    """Give a rehearsed LLM with self-drafting (speculative_config method "self_window") a
    ScriptedSelfDrafts as the sampler of its draft steps."""
    spec = llm.speculator
    if spec is None or not spec.self_drafting or not hasattr(llm.sampler, "plan_for"):
        raise ValueError("scripted self-drafts need a rehearsed LLM with self-drafting: LLM(..., device_model='h200', "
                         "speculative_config={'method': 'self_window', ...})")
    spec.draft_sampler = drafts = ScriptedSelfDrafts(profile, llm.sampler, seed)
    return drafts
