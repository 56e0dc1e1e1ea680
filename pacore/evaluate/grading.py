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
    """The answer an input record gives: ``ground_truth.answer`` (PaCoRe's form), or a bare string or
    number as ``ground_truth`` (other datasets' form); None when it gives none (``ungradable`` says why)."""
    gt = extra.get("ground_truth")
    if isinstance(gt, dict):
        return None if gt.get("answer") is None else str(gt["answer"])
    if isinstance(gt, str) and gt.strip() or isinstance(gt, (int, float)) and not isinstance(gt, bool):
        return str(gt)
    return None


def ungradable(extra: dict) -> str | None:
    """Why a problem (its input record, or its results record, which carries the input's keys) cannot be
    graded, or None when it can."""
    if ground_truth_answer(extra) is not None:
        return None
    gt = extra.get("ground_truth")
    if gt is None:
        return "no ground_truth"
    if isinstance(gt, dict):
        return "ground_truth has no 'answer'"
    if isinstance(gt, str):
        return "ground_truth is empty"
    return f"ground_truth is a {type(gt).__name__}, not an answer (a string, a number, or {{'answer': ...}})"


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
