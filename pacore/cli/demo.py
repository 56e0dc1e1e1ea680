"""The built-in demo problem set: easy arithmetic word problems with ground truth."""
from __future__ import annotations

import json

# Short answers keep the demo within a couple of minutes on two CPU cores.
_SUFFIX = " Answer in one short sentence that ends with the number."

DEMO_PROBLEMS: list[dict] = [
    {"id": "demo_apples", "question": "Tom has 3 apples and buys 4 more. How many apples does he have now?", "answer": "7"},
    {"id": "demo_pencils", "question": "A box holds 6 pencils. How many pencils are in 5 boxes?", "answer": "30"},
    {"id": "demo_cookies", "question": "Sara baked 20 cookies and ate 5 of them. How many cookies are left?", "answer": "15"},
    {"id": "demo_marbles", "question": "12 marbles are shared equally among 4 children. How many marbles does each child get?", "answer": "3"},
    {"id": "demo_birds", "question": "There are 9 birds on a tree. 2 fly away and then 6 more land. How many birds are on the tree?", "answer": "13"},
]


def demo_records() -> list[dict]:
    """The demo problems in the official PaCoRe JSONL format."""
    return [
        {
            "id": p["id"],
            "messages": [{"role": "user", "content": p["question"] + _SUFFIX}],
            "ground_truth": {"answer": p["answer"]},
            "category": "demo",
        }
        for p in DEMO_PROBLEMS
    ]


def write_demo_jsonl(path: str) -> None:
    """Write the demo problems to ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        for rec in demo_records():
            f.write(json.dumps(rec) + "\n")
