import pytest

from pacore.evaluate.grading import answers_equal, extract_answer, grade, ground_truth_answer, majority_vote


@pytest.mark.parametrize("text,expected", [
    ("so \\boxed{1/2}.", "1/2"),
    ("first \\boxed{3} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{{a}+{b}}", "{a}+{b}"),
    ("\\fbox{7}", "7"),
    ("We get 12 apples.\nSo the total is 15.\n\n", "15"),
    ("The result is 2,000 dollars", "2,000"),
    ("x = -3.5", "-3.5"),
    ("half is 1/2", "1/2"),
    ("no numbers here", None),
    ("", None),
    ("unclosed \\boxed{12", "12"),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("gold,answer,ok", [
    ("0.5", "1/2", True),
    ("0.5", "\\frac{1}{2}", True),
    ("\\frac{1}{2}", "0.5", True),
    ("5050", "5,050", True),
    ("32 cm²", "32", True),
    ("7", "8", False),
    ("Box B", "box b", True),  # not mathematics: normalised text
    ("Box B", "A", False),
])
def test_answers_equal(gold, answer, ok):
    assert answers_equal(gold, answer) is ok


def test_grade_boxed_half_vs_point_five():
    assert grade("The answer is \\boxed{1/2}", "0.5") == ("1/2", True)
    assert grade("The answer is \\boxed{1/3}", "0.5") == ("1/3", False)
    assert grade("nothing", "0.5") == (None, False)
    assert grade("\\boxed{4}", None) == ("4", None)


def test_ground_truth_answer():
    assert ground_truth_answer({"ground_truth": {"answer": 5}}) == "5"
    assert ground_truth_answer({"ground_truth": {}}) is None
    assert ground_truth_answer({}) is None


def test_majority_vote_groups_equal_answers():
    assert majority_vote(["1/2", "3", "0.5", None, "3", "\\frac{1}{2}"]) == "1/2"
    assert majority_vote(["4", "5"]) == "4"  # tie: first seen
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None
