"""Grading: answer extraction, math-verify comparison, and the self-consistency (majority vote) baseline."""
from __future__ import annotations

import re
import threading

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER_RE = re.compile(
    r"\\[dt]?frac\{[^{}]*\}\{[^{}]*\}"  # \frac{a}{b}
    r"|-?\d+(?:,\d{3})*(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?"  # 12, -3.5, 2,000, 1/2
    r"|-?\.\d+"
)


def _last_boxed(text: str) -> str | None:
    starts = [m.end() for m in _BOX_RE.finditer(text)]
    for start in reversed(starts):
        depth, i = 1, start
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start : i - 1].strip()
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a response: the last ``\\boxed{}`` content, else the last number
    (or fraction) on the last line that has one; None when there is neither."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    for line in reversed(text.splitlines()):
        matches = list(_NUMBER_RE.finditer(line))
        if matches:
            return matches[-1].group(0).strip()
    return None


def _normalize(s: str) -> str:
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    return re.sub(r"[\s$]", "", s).rstrip(".").lower()


def _timeouts() -> dict:
    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    if threading.current_thread() is threading.main_thread():
        return {}
    return {"parsing_timeout": None}


def answers_equal(gold: str, answer: str) -> bool:
    """True when ``answer`` is mathematically equal to ``gold`` (math-verify), or, when either
    side is not mathematics (e.g. "Box B"), equal as normalised text."""
    from math_verify import parse, verify  # imported lazily: sympy makes it slow to load

    t = _timeouts()
    try:
        g = parse(str(gold), **t)
        # Wrapping in $..$ anchors the extractor on the whole extracted answer.
        a = parse(f"${answer}$", **t) or parse(answer, **t)
        if g and a:
            return bool(verify(g, a, timeout_seconds=None if t else 5))
    except Exception:
        pass  # a grader failure is not an answer failure: fall back to text comparison
    return _normalize(str(gold)) == _normalize(answer)


def ground_truth_answer(extra: dict) -> str | None:
    """The ``ground_truth.answer`` of an input record, when it has one."""
    gt = extra.get("ground_truth")
    if isinstance(gt, dict) and gt.get("answer") is not None:
        return str(gt["answer"])
    return None


def grade(text: str, gold: str | None) -> tuple[str | None, bool | None]:
    """(extracted answer, correct); correct is None when there is no ground truth."""
    answer = extract_answer(text)
    if gold is None:
        return answer, None
    return answer, answer is not None and answers_equal(gold, answer)


def majority_vote(answers: list[str | None]) -> str | None:
    """The most frequent answer (mathematically equal answers vote together); ties go to the
    answer seen first. None when no answer was extracted."""
    clusters: list[list[str]] = []
    for ans in answers:
        if ans is None:
            continue
        for cluster in clusters:
            if _normalize(cluster[0]) == _normalize(ans) or answers_equal(cluster[0], ans):
                cluster.append(ans)
                break
        else:
            clusters.append([ans])
    if not clusters:
        return None
    best = max(len(c) for c in clusters)
    return next(c[0] for c in clusters if len(c) == best)
