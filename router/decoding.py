"""The speculative cascade decoding loop (docs/method.md, "The decoding loop").

`generate` decodes a batch of left-padded prompts block by block; one block (draft `gamma` tokens, verify
them in one forward, the policy's `pi = decide(view, alpha)`, accept a prefix, draw the next token) reads
top to bottom in `router/loop/block.py`. Each model keeps a KV cache that is rolled back on rejection,
never recomputing the accepted prefix, and rows of a batch accept different numbers of tokens (see
`router/loop/layout.py`). What every loop shares (settings, checks, outputs) is in `router/loop/common.py`,
the counters in `router/loop/stats.py`; the baselines in `router/loop/baselines.py`.
"""

from __future__ import annotations


import torch

from router.infra import clock
from router.machine.calibrate import MAX_GAMMA, AdaptiveGamma
from router.loop.block import decode_block, emit
from router.loop.block_size import block_drafts, check_block_size
from router.loop.layout import CachedModel, model_cache, drop_trailing_holes, output_pad_id
from router.loop.lookup import LookupCache, LookupDrafter
from router.loop.common import (
    check_loop_objects,
    FROM_VERIFIER,
    GenerateOutput,
    Rows,
    check_inputs,
    check_token_ids,
    eos_ids,
    finish,
    first_layout,
    forward_stats,
    one_model_step,
    shared_vocab,
    vocab_size,
)
from router.loop.options import DecodeOptions
from router.loop.prefix import SharedPrefix
from router.loop.stats import Stats
from router.policy import DeferralPolicy, judges_the_draft
from router.rules import resolve_rule
from router.tasks.prompts import StopStrings
from router.targets import trusted_inputs
from router.window.lag import LagCarry


def generate(
    drafter,
    verifier,
    input_ids: torch.Tensor,
    rule="opt",
    alpha: float = 0.3,
    gamma: int | str = DecodeOptions.gamma,
    temperature: float = DecodeOptions.temperature,
    top_p: float = DecodeOptions.top_p,
    max_new_tokens: int = DecodeOptions.max_new_tokens,
    seed: int = DecodeOptions.seed,
    attention_mask: torch.Tensor | None = None,
    bonus_from: str = DecodeOptions.bonus_from,
    stop: StopStrings | None = None,
    prefix: SharedPrefix | None = None,
    draft_stop: float | None = DecodeOptions.draft_stop,
    check_pair: bool = True,
) -> GenerateOutput:
    """Speculative cascade decoding of a batch of left-padded prompts (see module docstring).

    `rule` is a rule name from `router.rules.rule_names()` or any deferral policy with the same
    `target` method (e.g. a learned router from `router.model.load_router`). When every draft of a
    block passes, the bonus token comes from the verifier's p (bonus_from="verifier", the default:
    that one position defers, no drafter forward) or from pi (bonus_from="target", exact as in the
    paper: one more drafter forward per wholly accepted block to get q there, for every policy whose
    target reads q). The default was chosen with measured numbers (docs/results.md, the exact bonus's
    cost). `stop` strings end a row like EOS
    (`router.tasks.prompts.StopStrings`); a `prefix` every prompt starts with is read from its cache
    (`router.loop.prefix.SharedPrefix`) instead of being prefilled again. `draft_stop` (in (0, 1)) ends a
    block early when the drafter is unsure of its draft in every row (as Hugging Face's assistant
    confidence threshold and llama.cpp's draft p_min do); None drafts gamma tokens every block.
    gamma="auto" chooses the block size before every block from the pair's measured costs on this
    machine and the acceptance rate so far (`router.machine.calibrate.AdaptiveGamma`; the costs are measured
    once per process, pair and batch size, about 30 s for the embedded pair on 2 CPU cores); where
    no block size is expected to beat the verifier alone, it decodes with the verifier alone
    (stats `verifier_steps`), whatever the rule: the verifier's quality at the verifier's speed.
    `drafter` is a causal LM sharing the verifier's tokenizer, or a `router.loop.lookup.LookupDrafter`
    (drafts looked up in a reference answer per row, no network; with rule="lossless" and greedy
    decoding the output is still exactly the verifier's). A learned router decodes only with the
    models it was trained on (their weight fingerprints, computed once per model object);
    check_pair=False skips that check.
    """
    knobs = dict(temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens, gamma=gamma)
    opts = DecodeOptions(**knobs, draft_stop=draft_stop, bonus_from=bonus_from)  # checked once; only opts is read below
    attention_mask = check_inputs(input_ids, attention_mask)
    check_loop_objects(stop, prefix)
    check_token_ids(input_ids, drafter, verifier)
    policy = _decoding_policy(rule, drafter, verifier, check_pair, opts.gamma)
    vocab, drafter_cache = _drafter_for(drafter, verifier, policy, opts.gamma)
    verifier_cache = model_cache(verifier, vocab)
    verifier_cache.want_hidden = bool({"hidden_verifier", "hidden_after"} & policy.needs.inputs)
    exact_bonus = "bonus_q" in policy.needs and (opts.bonus_from == "target" or policy.exact_bonus)
    adaptive = AdaptiveGamma(drafter, verifier, input_ids.shape[0], exact_bonus) if opts.gamma == "auto" else None
    eos, gen, started = eos_ids(verifier), opts.generator(input_ids.device), clock.now()
    rows = Rows.start(input_ids.shape[0], eos, opts.max_new_tokens, stop)
    stats = Stats.start(policy.name, alpha, opts, MAX_GAMMA if adaptive else opts.gamma)
    pad = output_pad_id(verifier, eos)
    layout = first_layout(input_ids, attention_mask, prefix, pad, drafter_cache, verifier_cache)
    caches = (drafter_cache, verifier_cache)
    active = list(range(input_ids.shape[0]))
    needs = policy.needs
    carry = LagCarry(len(active), needs.lag, input_ids.device, needs.running) if "lag" in needs else None
    with torch.inference_mode(), trusted_inputs():  # q, p come from softmax here: skip re-checking them
        while active:
            remaining = max(opts.max_new_tokens - len(rows.tokens[b]) for b in active)
            start = layout.length
            g = adaptive.next() if adaptive else opts.gamma
            if g == 0:  # gamma auto: speculation does not pay here; the drafter's cache catches up if it resumes
                one_model_step(verifier_cache, layout, opts, gen, rows, active, FROM_VERIFIER, logps=True)
                stats.verifier_steps += 1
            else:
                g = block_drafts(policy, g, remaining)
                block, nxt = decode_block(policy, alpha, *caches, layout, opts, gen, g, stats, carry)
                kept = emit(stats, rows, active, block, nxt, judge=judges_the_draft(policy))  # on the host
                if adaptive:
                    adaptive.update(sum(kept), sum(min(n + 1, block.g) for n in kept))
                layout.keep_first(start, block.n_accepted)  # roll both caches back to the kept drafts
                drop_trailing_holes(layout, *caches, holes=layout.length - start - max(kept))
                layout.append(nxt[:, None])
            active = rows.drop_finished(active, layout, *caches, also=(carry,) if carry else ())
    stats.extra = {**forward_stats(drafter_cache, "drafter"), **forward_stats(verifier_cache, "verifier")}
    if adaptive:
        stats.extra.update(gamma_chosen=adaptive.chosen_counts(), acceptance_estimate=adaptive.acceptance)
    return finish(input_ids, rows, pad, stats.as_dict(), started)


def _decoding_policy(rule, drafter, verifier, check_pair: bool, gamma) -> DeferralPolicy:
    """The policy `rule` names, refused when it cannot decode (offline-only) or, for a learned
    router, when these are not the models it was trained on (check_pair=False skips that)."""
    policy = resolve_rule(rule)
    if policy.offline_only:
        raise ValueError(policy.offline_only)
    check_block_size(policy, gamma)
    if check_pair and policy.trained_pair:
        from router.pair import check_pair_is

        models = (None if isinstance(drafter, LookupDrafter) else drafter, verifier, None)
        check_pair_is(models, policy.trained_pair, f"router {policy.name}")
    return policy


def _drafter_for(drafter, verifier, policy: DeferralPolicy, gamma) -> tuple[int, CachedModel | LookupCache]:
    """(shared vocabulary, what the loop drives as the drafter): a model's CachedModel, or a
    LookupDrafter's drafts looked up in reference answers (router.loop.lookup; no network)."""
    if not isinstance(drafter, LookupDrafter):
        vocab = shared_vocab(drafter, verifier)
        model = model_cache(drafter, vocab)
        model.want_hidden = "hidden_drafter" in policy.needs
        return vocab, model
    if gamma == "auto" or "hidden_drafter" in policy.needs:
        raise ValueError(
            "a LookupDrafter has no network: give gamma as a number and a policy that does not read "
            "the drafter's hidden state"
        )
    vocab = vocab_size(verifier)
    return vocab, drafter.attach(vocab)
