"""Hugging Face front ends (router/hf): `verifier.generate(custom_generate=<router folder>)` and the
in-process `cascade_generate` give exactly `router.decoding.generate`'s tokens, follow transformers'
return conventions, and refuse what the loop cannot do; the `mixture` rule matches transformers' own
`assistant_ensemble_weight`."""

from __future__ import annotations

import contextlib
import math
import re

import pytest
import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from router.decoding import generate
from router.loop.layout import left_pad
from router.hf import CascadeGenerateOutput, GenerationSettingError, cascade_generate
from router.model import LearnedRouter, RouterConfig, RouterNet, load_router, save_router
from router.pair import pair_identity
from router.tasks.prompts import StopStrings

ALPHA = 0.2
SAMPLING = dict(do_sample=True, temperature=0.8, top_p=0.9, top_k=0)


def _router(folder, tiny, **cfg):
    torch.manual_seed(0)
    pair = pair_identity(tiny.drafter, tiny.verifier, None)
    return save_router(LearnedRouter(RouterNet(RouterConfig(pair=pair, **cfg))), folder)


@pytest.fixture(scope="module")
def routers(tmp_path_factory, tiny):
    tmp = tmp_path_factory.mktemp("hf-routers")
    vocab = tiny.verifier.config.vocab_size
    return {
        "cascade": _router(tmp / "cascade", tiny),
        "token": _router(tmp / "token", tiny, head="token"),
        "judge": _router(
            tmp / "judge", tiny, head="judge", vocab=vocab, hidden_inputs=["after"], hidden_sizes={"after": 64}
        ),
    }


@pytest.fixture(scope="module")
def batch(tiny):
    return left_pad([tiny.tokenizer.encode("Add 2 and 3."), tiny.tokenizer.encode("Hi")], 0)  # two left-padded rows


def _hf(tiny, ids, mask, route: str, policy, **kwargs):
    """One call through transformers: the remote-code folder route or the in-process function."""
    common = dict(input_ids=ids, attention_mask=mask, max_new_tokens=24, **kwargs)
    if route == "folder":
        return tiny.verifier.generate(
            assistant_model=tiny.drafter, custom_generate=str(policy), trust_remote_code=True, **common
        )
    return tiny.verifier.generate(custom_generate=cascade_generate, assistant_model=tiny.drafter, rule=policy, **common)


@pytest.mark.parametrize("route", ["folder", "function"])
@pytest.mark.parametrize("kind", ["rule", "cascade", "token", "judge"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_hf_routes_give_the_loops_tokens(tiny, routers, batch, route, kind, sampled):
    ids, mask = batch
    policy = "token_v2" if kind == "rule" else routers[kind]
    # a plug-in rule through a folder: router= in the call overrides the folder's own router
    override = dict(router="token_v2") if kind == "rule" and route == "folder" else {}
    folder_or_rule = routers["cascade"] if override else policy
    sampling = SAMPLING if sampled else {"do_sample": False}
    loop = dict(temperature=0.8, top_p=0.9) if sampled else {}
    rule = policy if kind == "rule" else load_router(policy)
    want = generate(
        tiny.drafter, tiny.verifier, ids, rule=rule, alpha=ALPHA, attention_mask=mask, max_new_tokens=24, seed=7, **loop
    )
    got = _hf(tiny, ids, mask, route, folder_or_rule, alpha=ALPHA, seed=7, **sampling, **override)
    assert torch.equal(got, want.sequences)


@pytest.mark.parametrize("route", ["folder", "function"])
def test_lossless_through_hf_is_the_verifiers_greedy_output(tiny, routers, batch, route):
    ids, mask = batch
    plain = tiny.verifier.generate(input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False)
    kwargs = dict(router="lossless") if route == "folder" else {}
    policy = routers["cascade"] if route == "folder" else "lossless"
    got = _hf(tiny, ids, mask, route, policy, do_sample=False, **kwargs)
    assert torch.equal(got, plain)


def test_return_dict_follows_transformers_conventions(tiny, routers, batch):
    ids, mask = batch
    out = _hf(tiny, ids, mask, "folder", routers["token"], alpha=ALPHA, do_sample=False, return_dict_in_generate=True)
    assert isinstance(out, CascadeGenerateOutput) and isinstance(out, GenerateDecoderOnlyOutput)
    assert out.sequences.shape[0] == 2 and out.scores is None
    assert out.stats["rule"] == "token" and out.stats["new_tokens"] > 0
    assert out.sources.shape == (2, out.sequences.shape[1] - ids.shape[1])
    assert out["sequences"] is out.sequences  # a ModelOutput: key access too


def test_seed_defaults_to_torchs_global_generator(tiny, batch):
    ids, mask = batch
    runs = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        runs.append(_hf(tiny, ids, mask, "function", "token_v2", alpha=ALPHA, **SAMPLING))
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_stop_strings_on_both_routes(tiny, routers, batch):
    ids, mask = batch
    text = tiny.tokenizer.decode(_hf(tiny, ids, mask, "function", "lossless", do_sample=False)[0, ids.shape[1] :])
    stop = text[3:5]  # a stretch the greedy output does contain
    want = generate(
        tiny.drafter,
        tiny.verifier,
        ids,
        rule="lossless",
        attention_mask=mask,
        max_new_tokens=24,
        stop=StopStrings.build(tiny.tokenizer, [stop]),
    ).sequences
    built = StopStrings.build(tiny.tokenizer, [stop])  # in process: transformers keeps tokenizer= to itself
    by_function = _hf(tiny, ids, mask, "function", "lossless", do_sample=False, stop_strings=built)
    by_folder = _hf(
        tiny,
        ids,
        mask,
        "folder",
        routers["cascade"],
        router="lossless",
        do_sample=False,
        stop_strings=[stop],
        tokenizer=tiny.tokenizer,
    )
    assert torch.equal(by_function, want) and torch.equal(by_folder, want)
    assert want.shape[1] < ids.shape[1] + 24


@contextlib.contextmanager
def fixed_drafts(drafter, gamma: int):
    """transformers' assistant drafts exactly gamma tokens per block (no schedule, no confidence stop),
    as specroute's loop does with a fixed gamma; restored afterwards (the tiny pair is shared)."""
    gen = drafter.generation_config
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = [getattr(gen, n) for n in names]
    for name, value in zip(names, (gamma, "constant", 0.0)):
        setattr(gen, name, value)
    try:
        yield
    finally:
        for name, value in zip(names, saved):
            setattr(gen, name, value)


def test_mixture_is_transformers_ensemble_verification_greedy(tiny):
    """Greedy: identical tokens to assisted generation with assistant_ensemble_weight = alpha."""
    ids = torch.tensor([tiny.tokenizer.encode("Hello there, how")])
    with fixed_drafts(tiny.drafter, 4):
        for w in (0.3, 0.7):
            theirs = tiny.verifier.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                assistant_model=tiny.drafter,
                do_sample=False,
                max_new_tokens=40,
                assistant_ensemble_weight=w,
            )
            ours = generate(tiny.drafter, tiny.verifier, ids, rule="mixture", alpha=w, gamma=4, max_new_tokens=40)
            assert torch.equal(theirs, ours.sequences)


def test_mixture_samples_the_ensemble_distribution(tiny):
    """Sampling: the first token after a one-draft block is distributed as w p + (1 - w) q, for specroute
    (one batched call) and for transformers (one call per draw), by a chi-square test against it, and
    neither is distributed as p or q alone. At temperature 1: at other temperatures transformers'
    assisted sampling appears to warp the assistant's logits twice (its drafts then follow q at T^2)."""
    w, temperature, n = 0.5, 1.0, 1500
    ids = torch.tensor([tiny.tokenizer.encode("Hello")])
    with torch.no_grad():
        q = (tiny.drafter(ids).logits[0, -1] / temperature).softmax(-1).double()
        p = (tiny.verifier(ids).logits[0, -1] / temperature).softmax(-1).double()
    nu = w * p + (1 - w) * q
    ours = generate(
        tiny.drafter,
        tiny.verifier,
        ids.repeat(n, 1),
        rule="mixture",
        alpha=w,
        gamma=1,
        max_new_tokens=2,
        temperature=temperature,
        seed=1,
    ).sequences[:, ids.shape[1]]
    torch.manual_seed(0)
    with fixed_drafts(tiny.drafter, 1):
        theirs = torch.tensor(
            [
                int(
                    tiny.verifier.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        assistant_model=tiny.drafter,
                        do_sample=True,
                        top_k=0,
                        temperature=temperature,
                        max_new_tokens=2,
                        assistant_ensemble_weight=w,
                    )[0, ids.shape[1]]
                )
                for _ in range(600)
            ]
        )
    for draws in (ours, theirs):
        assert _chi_square_p(draws, nu) > 1e-3
        assert _chi_square_p(draws, p) < 1e-3 and _chi_square_p(draws, q) < 1e-3


def _chi_square_p(draws: torch.Tensor, dist: torch.Tensor) -> float:
    """p-value of draws against dist, tokens with expected count < 5 pooled into one cell."""
    from scipy.stats import chi2

    counts = torch.bincount(draws, minlength=dist.shape[0]).double()
    expected = dist * len(draws)
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return float(chi2.sf(stat, int(keep.sum()) - 1)) if keep.sum() > 1 else 1.0


def test_a_folder_needs_trust_remote_code(tiny, routers, batch):
    ids, mask = batch
    with pytest.raises(ValueError, match="trust_remote_code"):
        tiny.verifier.generate(
            input_ids=ids,
            attention_mask=mask,
            assistant_model=tiny.drafter,
            custom_generate=str(routers["cascade"]),
            alpha=ALPHA,
            max_new_tokens=4,
        )


@pytest.mark.parametrize("route", ["folder", "function"])
def test_a_router_refuses_another_pair_unless_told(tiny, batch, tmp_path, route):
    ids, mask = batch
    torch.manual_seed(0)
    other = {"drafter": "0" * 16, "verifier": "1" * 16}
    folder = save_router(LearnedRouter(RouterNet(RouterConfig(pair=other))), tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="differ from the ones router elsewhere was made with"):
        _hf(tiny, ids, mask, route, folder, alpha=ALPHA, do_sample=False)
    assert _hf(tiny, ids, mask, route, folder, alpha=ALPHA, do_sample=False, check_pair=False).shape[0] == 2


@pytest.mark.parametrize(
    "setting, message",
    [
        (dict(num_beams=2), "beam search"),
        (dict(do_sample=True, top_k=10), "top_k"),
        (dict(repetition_penalty=1.3), "repetition_penalty"),
        (dict(min_new_tokens=3), "min_new_tokens"),
        (dict(output_scores=True, return_dict_in_generate=True), "output_scores"),
        # transformers keeps these to itself: the in-process route must pass them on
        (dict(streamer="STREAMER"), "streamer is not supported"),
        (dict(negative_prompt_ids="PROMPT"), "negative_prompt_ids is not supported"),
        (dict(assistant_confidence_threshold=0.5), "assistant_confidence_threshold=0.5"),
        (dict(num_assistant_tokens=3), "num_assistant_tokens=3"),
        (dict(guidance_scale=1.5), "guidance_scale=1.5"),
    ],
)
@pytest.mark.parametrize("route", ["folder", "function"])
def test_unsupported_settings_are_refused_by_name(tiny, routers, batch, setting, message, route):
    from transformers.generation.streamers import BaseStreamer

    from router.hf.settings import REFUSED_ARGUMENTS, REFUSED_SETTINGS

    class Quiet(BaseStreamer):  # takes a batch (TextStreamer takes one row) and shows nothing
        def put(self, value):
            pass

        def end(self):
            pass

    ids, mask = batch
    swap = {"STREAMER": Quiet(), "PROMPT": ids[:1]}
    setting = {k: swap.get(v, v) if isinstance(v, str) else v for k, v in setting.items()}
    with pytest.raises(GenerationSettingError, match=message):
        _hf(tiny, ids, mask, route, routers["cascade"], alpha=ALPHA, **{"do_sample": False, **setting})
    assert set(setting) - {"do_sample", "top_k", "num_beams", "repetition_penalty", "min_new_tokens"} - {
        "output_scores",
        "return_dict_in_generate",
    } <= set(REFUSED_ARGUMENTS) | set(REFUSED_SETTINGS)  # one list serves both routes


@pytest.mark.parametrize("route", ["folder", "function"])
def test_a_router_folder_that_does_not_exist_is_named(tiny, routers, batch, route):
    ids, mask = batch
    with pytest.raises(GenerationSettingError, match="no router folder /nonexistent"):
        if route == "folder":
            tiny.verifier.generate(
                input_ids=ids,
                assistant_model=tiny.drafter,
                custom_generate=str(routers["cascade"]),
                trust_remote_code=True,
                router="/nonexistent",
                alpha=ALPHA,
            )
        else:
            _hf(tiny, ids, mask, route, "/nonexistent", alpha=ALPHA, do_sample=False)


def test_missing_pieces_are_named(tiny, routers, batch):
    ids, mask = batch
    with pytest.raises(GenerationSettingError, match="assistant_model"):
        tiny.verifier.generate(
            input_ids=ids, custom_generate=str(routers["cascade"]), trust_remote_code=True, alpha=ALPHA
        )
    with pytest.raises(GenerationSettingError, match="pass assistant_model=<the drafter>"):
        tiny.verifier.generate(input_ids=ids, custom_generate=cascade_generate, rule="opt", alpha=ALPHA)
    with pytest.raises(GenerationSettingError, match="needs alpha"):
        _hf(tiny, ids, mask, "folder", routers["cascade"], do_sample=False)
    with pytest.raises(GenerationSettingError, match=r"StopStrings.build\(tokenizer"):
        _hf(tiny, ids, mask, "function", "lossless", do_sample=False, stop_strings=["x"])


@pytest.mark.parametrize(
    "spelling, instead",
    [
        ("drafter", "assistant_model=<the drafter>"),
        ("stop", "stop_strings="),
        ("stop_tokenizer", "tokenizer=<the tokenizer>"),
    ],
)
def test_specroutes_former_spellings_are_refused_with_transformers_names(tiny, batch, spelling, instead):
    ids, mask = batch
    value = {"drafter": tiny.drafter, "stop": ["x"], "stop_tokenizer": tiny.tokenizer}[spelling]
    with pytest.raises(
        GenerationSettingError, match=rf"{spelling}= is not transformers' name: pass {re.escape(instead)}"
    ):
        _hf(tiny, ids, mask, "function", "lossless", do_sample=False, **{spelling: value})


def test_module_cache_is_temporary():
    import transformers.dynamic_module_utils as dm

    assert "specroute-test-hf-modules-" in str(dm.HF_MODULES_CACHE)
    assert math.isfinite(ALPHA)
