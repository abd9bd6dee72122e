"""What the router reads from and writes into a request it forwards to vLLM's server
(`router/forward.py`)."""

from __future__ import annotations

import json

import pytest
from splitserve.router import forward
from splitserve.router.errors import APIError

from splitserve.engine.messages import GenerateRequest, Sampling


def _fwd(endpoint="completions", **payload):
    return forward.parse(endpoint, json.dumps({"model": "m", "prompt": "hi", **payload}).encode())


@pytest.mark.parametrize("body", [b"{", b"[1, 2]", b'"text"'])
def test_a_body_that_is_not_a_json_object_is_400(body):
    with pytest.raises(APIError) as err:
        forward.parse("chat", body)
    assert err.value.status == 400


@pytest.mark.parametrize(("payload", "budget"), [
    ({}, None), ({"max_tokens": 7}, 7), ({"max_completion_tokens": 5, "max_tokens": 9}, 5),
    ({"max_tokens": -1}, None), ({"max_tokens": "7"}, None), ({"max_tokens": True}, None),
])
def test_the_output_budget_is_read_only_from_valid_values(payload, budget):
    # anything else is left to vLLM's server to judge
    assert _fwd(**payload).max_tokens == budget


@pytest.mark.parametrize(("payload", "choices", "disaggregable"), [
    ({}, 1, True), ({"n": 3}, 3, True), ({"best_of": 2}, 2, True),
    ({"use_beam_search": True}, 1, False), ({"prompt": ["a", "b"]}, 2, False),
    ({"prompt": ["a", "b"], "n": 2}, 4, False), ({"prompt": [1, 2, 3]}, 1, True),
    ({"prompt_logprobs": 1}, 1, False),
])
def test_several_prompts_beams_or_prompt_logprobs_stay_on_one_engine(payload, choices,
                                                                      disaggregable):
    # several samples of one prompt share one handoff (the decode engine pulls it once)
    fwd = _fwd(**payload)
    assert (fwd.choices, fwd.disaggregable) == (choices, disaggregable)


def test_the_router_sets_its_own_fields_and_drops_a_clients_kv_params():
    fwd = _fwd(request_id="mine", cache_salt="theirs", model="alias",
               kv_transfer_params={"remote_block_ids": [1]}, ec_transfer_params={"x": 1})
    call = forward.call(fwd, model="served", request_id="r1", cache_salt="tenant-salt")
    assert call.path == "/v1/completions" and call.method == "POST"
    body = call.json
    assert (body["model"], body["request_id"], body["cache_salt"]) == ("served", "r1",
                                                                      "tenant-salt")
    assert "kv_transfer_params" not in body and "ec_transfer_params" not in body
    assert json.loads(call.encoded()) == body


def test_each_hop_gets_its_request_id_and_handoff():
    call = forward.call(_fwd("chat", messages=[], stream=True, n=1, logprobs=True,
                             max_completion_tokens=50, min_tokens=5),
                        model="m", request_id="r", cache_salt=None)
    req = GenerateRequest("r-prefill", (1, 2), Sampling(max_tokens=50), http=call,
                          kv_transfer_params={"do_remote_decode": True})
    prefill = forward.engine_request(req).http.json
    assert prefill["request_id"] == "r-prefill"
    assert prefill["kv_transfer_params"] == {"do_remote_decode": True}
    assert (prefill["max_tokens"], prefill["max_completion_tokens"], prefill["stream"]) == (
        1, 1, False)
    assert "logprobs" not in prefill and "min_tokens" not in prefill
    decode = forward.engine_request(GenerateRequest(
        "r", (1, 2), Sampling(max_tokens=50), http=call,
        kv_transfer_params={"do_remote_prefill": True, "remote_block_ids": [3]})).http.json
    assert decode["stream"] is True and decode["max_completion_tokens"] == 50
    assert decode["kv_transfer_params"]["remote_block_ids"] == [3]


class _Tok:
    chat_template = "{{ messages }} tools"

    def __call__(self, text):
        return {"input_ids": list(range(len(text.split())))}

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, **kwargs):
        if kwargs.get("boom"):
            raise ValueError("template error")
        words = sum(len(m["content"].split()) for m in messages)
        return list(range(words + 2 * len(messages) + (1 if add_generation_prompt else 0)))


class _Prompts:
    tokenizer = _Tok()
    renders_tools = True


@pytest.mark.parametrize(("endpoint", "payload", "count"), [
    ("completions", {"prompt": "a b c"}, 3),
    ("completions", {"prompt": [5, 6]}, 2),
    ("completions", {"prompt": ["a b", "c"]}, 2),  # several prompts: the first
    ("completions", {"prompt": {"bad": 1}}, 0),  # vLLM's server will refuse it
    ("chat", {"messages": [{"role": "user", "content": "a b"}]}, 5),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a b c"}]}],
              "add_generation_prompt": False}, 5),
    ("chat", {"messages": [{"role": "user", "content": "a b"}],
              "chat_template_kwargs": {"boom": True}}, 2),  # the template fails: its words
])
def test_the_prompt_estimate(endpoint, payload, count):
    assert len(forward.estimate_prompt(forward.Forwarded(endpoint, payload), _Prompts())) == count
