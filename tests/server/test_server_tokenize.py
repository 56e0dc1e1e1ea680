"""vLLM's /tokenize and /detokenize: its request and response shapes, the ids the completion routes
generate from, behind the API key, and errors that name the problem."""
import json
from types import SimpleNamespace

import httpx
import openai
import pytest
from server_helpers import serving

from engine import LLM
from engine.serve.app import create_app

KEY, MODEL = "k", "tiny"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 7 * 6?"}]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)
    app = create_app(llm, MODEL, api_key=KEY, aliases=("default",))
    with serving(app) as base:
        yield SimpleNamespace(base=base, llm=llm)


def _post(server, path: str, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    return httpx.post(f"{server.base}{path}", content=json.dumps(body), headers=headers)


def test_tokenize_a_text_in_vllms_shape(server):
    reply = _post(server, "/tokenize", {"model": MODEL, "prompt": "abc cab"})
    assert reply.status_code == 200
    ids = server.llm.tokenizer.encode("abc cab")
    assert reply.json() == {"count": len(ids), "max_model_len": 256, "tokens": ids, "token_strs": None}
    bare = _post(server, "/tokenize", {"prompt": "abc", "add_special_tokens": False, "return_token_strs": True}).json()
    assert bare["tokens"] == server.llm.tokenizer.encode("abc", add_special_tokens=False)
    assert bare["token_strs"] == server.llm.tokenizer.convert_ids_to_tokens(bare["tokens"])


def test_tokenize_messages_counts_what_chat_completions_prefill(server):
    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0)
    usage = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1).usage
    chat = _post(server, "/tokenize", {"model": MODEL, "messages": MESSAGES}).json()
    assert chat["count"] == usage.prompt_tokens == len(chat["tokens"])
    without = _post(server, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}).json()
    assert without["count"] < chat["count"] and chat["tokens"][:without["count"]] == without["tokens"]


def test_detokenize_inverts_tokenize(server):
    ids = _post(server, "/tokenize", {"prompt": "a b c", "add_special_tokens": False}).json()["tokens"]
    assert _post(server, "/detokenize", {"model": "default", "tokens": ids}).json() == {"prompt": "a b c"}


@pytest.mark.parametrize("path, body, key, status, said", [
    ("/tokenize", {"prompt": "x"}, None, 401, "API key"),
    ("/detokenize", {"tokens": [1]}, "wrong", 401, "API key"),
    ("/tokenize", {"model": "other", "prompt": "x"}, KEY, 404, "serves `tiny`"),
    ("/detokenize", {"tokens": [10 ** 6]}, KEY, 400, "not in the tokenizer's vocabulary"),
    ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, KEY, 400, "add_generation_prompt to false"),
    ("/tokenize", {"prompt": "x", "messages": MESSAGES}, KEY, 422, "not a field"),
    ("/detokenize", {"tokens": "abc"}, KEY, 422, "tokens"),
])
def test_tokenizer_route_errors_name_the_problem(server, path, body, key, status, said):
    reply = _post(server, path, body, key)
    assert reply.status_code == status and said in reply.json()["error"]["message"]
