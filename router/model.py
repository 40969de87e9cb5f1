"""Learned deferral routers: small torch networks over `router/features.py` features.

A router predicts, per position, the quality gap of keeping the drafter (docs/method.md, Learned routers). It
plugs into `router.decoding.generate` through the same policy call as the plug-in rules,
`decide(view, alpha)` on a `router.view.BlockView` (and `target(q, p, alpha, q_raw, p_raw)` where it reads
nothing more):
- cascade head: defer where the predicted gap exceeds `alpha * TV(p, q)`; `pi = (1 - r) q + r p`;
- token head: score each candidate drafter token v (the position's features plus v's own
  probabilities) and keep v where the predicted gap is at most `alpha`;
  `pi = q 1[A] + p * q(outside A)`. Candidates are the drafter's top `token_candidates` tokens;
  the rest of its mass (tiny at any usable temperature) defers.
Export: `save_router(router, dir)` writes `model.safetensors` + `config.json`; `load_router(dir)`
rebuilds it with torch alone. Importable without lightning or wandb. A router may also read the
drafter's and/or verifier's last hidden state (`hidden_inputs`); its `needs` say so, and `generate` then
asks the models for them and puts them in the view.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from router.arch import (
    ARCHS,
    HEADS,
    HIDDEN_ROLES,
    ROUTER_FORMAT,
    RouterArch,
    RouterConfig,
    RouterError,
    check_feature_names,
    check_router_pair,
    router_needs,
)
from router.export.hub import RouterHubMixin
from router.features import FEATURE_NAMES, candidates_of, class_bits, judge_features, shifted_lookahead
from router.infra.files import file_sha256
from router.policy import alpha_number
from router.infra.stage_folders import STAGE_MARK, claim_output
from router.records import SCHEMA_VERSION
from router.reduce import fast_topk_ids
from router.targets import cascade_mix, keep_drafts, token_mix, tv_distance
from router.view import BlockView
from router.inputs import judge_inputs

# the config side lives in router/arch.py; these names stay importable from here, the public module
__all__ = [
    "ARCHS",
    "HEADS",
    "HIDDEN_ROLES",
    "ROUTER_FORMAT",
    "LearnedRouter",
    "RouterArch",
    "RouterConfig",
    "RouterError",
    "RouterNet",
    "check_feature_names",
    "check_router_pair",
    "load_router",
    "router_needs",
    "save_router",
    "windows",
]


class RouterNet(nn.Module):
    """Features (N, D) -> predicted gap (N,); the gru arch takes (N, window, D)."""

    def __init__(self, cfg: RouterConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.input_dim
        self.register_buffer("mean", torch.zeros(d))  # input standardisation, set from training data
        self.register_buffer("std", torch.ones(d))
        if cfg.head == "judge":  # class bits per token id (router.features.token_class_table): no tokenizer online
            self.register_buffer("token_classes", torch.zeros(cfg.vocab, dtype=torch.uint8))
        if cfg.arch == "linear":
            self.body = nn.Linear(d, 1)
        elif cfg.arch == "mlp":
            layers, width_in = [], d
            for _ in range(cfg.depth):
                layers += [nn.Linear(width_in, cfg.width), nn.GELU()]
                width_in = cfg.width
            self.body = nn.Sequential(*layers, nn.Linear(width_in, 1))
        else:
            self.gru = nn.GRU(d, cfg.width, batch_first=True)
            self.body = nn.Linear(cfg.width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.mean) / self.std
        if self.cfg.arch == "gru":
            out, _ = self.gru(x)  # (N, window, width)
            x = out[:, -1]
        return self.body(x).squeeze(-1)


def windows(feats: torch.Tensor, window: int) -> torch.Tensor:
    """(..., T, D) -> (..., T, window, D): each position with its window-1 predecessors, zero-padded."""
    pad = torch.zeros(*feats.shape[:-2], window - 1, feats.shape[-1], dtype=feats.dtype, device=feats.device)
    padded = torch.cat([pad, feats], -2)  # (..., T + window - 1, D)
    return padded.unfold(-2, window, 1).transpose(-1, -2)


class LearnedRouter(RouterHubMixin):
    """A trained RouterNet behind the plug-in rules' policy interface (router/policy.py); `save_pretrained`,
    `from_pretrained` (a folder or a Hub id) and `push_to_hub` come from `router.export.hub`."""

    def _write_router_folder(self, folder) -> None:  # the Hub mixin's save hook
        save_router(self, folder)

    @classmethod
    def _read_router_folder(cls, folder) -> "LearnedRouter":  # the Hub mixin's load hook
        return load_router(folder)

    def __init__(self, net: RouterNet, name: str = "router"):
        self.net = net.eval()
        self.cfg = net.cfg
        self.name = name
        self.form = self.cfg.head  # "cascade", "token" or "judge": the form of pi (router.policy.DeferralPolicy)
        self.needs = router_needs(self.cfg)
        self.min_gamma = 1  # a window judge reads the drafts that exist (the rest are marked invalid)
        self.exact_bonus = False  # a learned policy follows bonus_from
        self.greedy_mode = False  # its pi is one-hot at temperature 0 already (cascade_mix/token_mix of one-hots)
        self.trained_pair = self.cfg.pair or None  # checked against the models it decodes with
        # a gru reads each position with its predecessors on the trajectory (as recorded); the loop
        # decides a block at a time and does not carry the trajectory's features across blocks
        self.offline_only = (
            f"router {name!r} is a gru (window {self.cfg.window}): it was trained and is scored offline on "
            f"each position with its predecessors on the trajectory, which the decoding loop does not carry "
            f"across blocks, so its online decisions would not be the ones its offline numbers describe; it "
            f"is offline-only: train arch=mlp (or linear) to decode with a router"
            if self.cfg.arch == "gru"
            else None
        )
        check_feature_names(self.cfg.feature_names, name)

    def check_alpha(self, alpha: float) -> float:
        """alpha as a float; any finite value is a threshold on the predicted gap."""
        alpha = alpha_number(alpha, f"router {self.name}")
        if not math.isfinite(alpha):
            raise ValueError(f"router {self.name}: alpha must be a finite number, got {alpha}")
        return alpha

    def position_inputs(self, view: BlockView) -> torch.Tensor:
        """Per-position router input (..., D): token_features, then the hidden states it reads."""
        return self._inputs(self._stats(view)[0], view)

    def _stats(self, view: BlockView) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(position features (..., F), q's argmax (...), p's argmax (...)) from the view's distributions."""
        return view.position_stats()

    def _inputs(self, feats: torch.Tensor, view: BlockView) -> torch.Tensor:
        return torch.cat([feats, *self._hidden_parts(view, feats.shape[:-1])], -1)

    @torch.no_grad()
    def score_positions(self, feats: torch.Tensor) -> torch.Tensor:
        """Predicted gap (..., T) from position inputs (..., T, D), cascade head.

        The gru arch sees each position with its predecessors inside the same call (the current
        block while decoding), zero-padded before the first.
        """
        if self.cfg.arch == "gru":
            flat = windows(feats, self.cfg.window).reshape(-1, self.cfg.window, feats.shape[-1])
        else:
            flat = feats.reshape(-1, feats.shape[-1])
        return self.net(flat).reshape(feats.shape[:-1])

    def decide(self, view: BlockView, alpha: float) -> torch.Tensor:
        """pi (..., V) as a plug-in rule would give it, from the view's q, p (scaled), q_raw, p_raw
        (temperature 1) and what `needs` declares: the logits behind the raw distributions (optional:
        cheaper features, same values), the hidden states it reads, and for a judge the drafts and the
        verifier's next-token distribution after each (its pi is the draft itself where it keeps it, else
        p), for a window judge their follow window, for a lag judge the positions before the block."""
        if isinstance(alpha, float) and math.isnan(alpha):
            raise ValueError(f"router {self.name}: alpha is NaN")
        if self.cfg.head == "judge":
            return keep_drafts(
                view.p, view.read("drafts", f"router {self.name}", RouterError), self.judge_scores(view) <= alpha
            )
        stats, q_arg, p_arg = self._stats(view)
        feats = self._inputs(stats, view)  # (..., D)
        q, p = view.q, view.p
        if self.cfg.head == "cascade":
            gap = self._cascade_gap(feats)
            # at temperature 1 without top-p the scaled distributions are the raw ones, whose TV the
            # features already hold: skip another pass over the vocabulary
            same = q is view.q_raw and p is view.p_raw
            tv = feats[..., FEATURE_NAMES.index("tv")] if same else tv_distance(p, q)
            return cascade_mix(q, p, gap > alpha * tv)
        cand, gap = self.candidate_scores(q, view.q_raw, view.p_raw, feats, q_arg, p_arg)  # (..., K) each
        return token_mix(q, p, torch.zeros_like(q, dtype=torch.bool).scatter(-1, cand, gap <= alpha))

    @torch.no_grad()
    def greedy_keep(self, view, alpha: float) -> torch.Tensor | None:
        """Where `decide` keeps each draft at temperature 0 (...) bool, from a router.greedy.GreedyView (q and p
        scaled are one-hot there: TV is 1 where the draft is not the verifier's argmax; a token head keeps the
        draft where its candidate's gap is <= alpha); None for a judge or a router reading hidden states."""
        if self.cfg.head == "judge" or self.cfg.hidden_inputs:
            return None
        alpha = self.check_alpha(alpha)
        feats, q_arg, p_arg = view.position_stats  # (..., F), (...), (...)
        if self.cfg.head == "cascade":
            return ~(self._cascade_gap(feats) > alpha * view.differs.float())
        d = view.drafts[..., None]  # (..., 1): the draft is the drafter's top candidate
        return self._candidate_gaps(feats, view.q_raw, view.p_raw, d, q_arg, p_arg)[..., 0] <= alpha

    def _cascade_gap(self, feats: torch.Tensor) -> torch.Tensor:
        """Cascade head: the predicted gap (...) from position inputs (..., D), a single position too."""
        return self.score_positions(feats) if feats.dim() > 1 else self.score_positions(feats[None])[0]

    def target(self, q, p, alpha, q_raw=None, p_raw=None) -> torch.Tensor:
        """pi (..., V) for q, p (..., V) scaled and *_raw temperature 1: `decide` on a view of just these (a
        router that reads more, a judge or one reading hidden states, is called with decide on a BlockView)."""
        if self.cfg.head == "judge":
            raise RouterError(
                f"router {self.name} is a judge: it decides drafted tokens, so call decide(BlockView(q, p, q_raw, "
                f"p_raw, drafts=..., next_p_raw=...), alpha) (router.view; router.decoding.generate does)"
            )
        return self.decide(BlockView(q, p, q_raw, p_raw), alpha)

    @torch.no_grad()
    def judge_scores(self, view: BlockView) -> torch.Tensor:
        """Predicted gap (...) of keeping each drafted token (...) rather than the verifier's choice, from the
        view's drafts and lookahead, then the extra inputs its config switches on (router/inputs.py: a window
        judge each draft's FollowWindow, a lag judge a LagBefore for a block (B, g) or each position's
        LagHistory, a running judge the answer so far)."""
        reader = f"router {self.name} (a judge)"
        drafts, next_p_raw = view.read("drafts", reader, RouterError), view.read("next_p_raw", reader, RouterError)
        q_raw, p_raw = view.q_raw, view.p_raw
        d = drafts.long()[..., None]
        position, q_arg, p_arg = self._stats(view)  # (..., F), (...), (...)
        x = judge_features(
            position,
            q_raw.gather(-1, d)[..., 0],
            p_raw.gather(-1, d)[..., 0],
            drafts == p_arg,
            drafts == q_arg,
            shifted_lookahead(p_raw, next_p_raw, position, view.get("next_p_logits")),
            class_bits(self.net.token_classes, drafts),
        )
        for spec in judge_inputs(self.cfg):  # its extra inputs, each as router/inputs.py declares it
            x = torch.cat(
                [x, spec.online(view, position, self.cfg, f"router {self.name}", RouterError).to(x.dtype)], -1
            )
        x = torch.cat([x, *self._hidden_parts(view, x.shape[:-1])], -1)  # (..., D)
        return self.net(x.reshape(-1, x.shape[-1])).reshape(drafts.shape)

    def _hidden_parts(self, view: BlockView, lead: tuple) -> list[torch.Tensor]:
        parts = []
        for role in self.cfg.hidden_inputs:  # the order the net was trained on
            h = view.get(f"hidden_{role}")
            if h is None:
                raise RouterError(
                    f"router {self.name} reads the {role}'s hidden state: pass BlockView(..., hidden_{role}="
                    f"tensor (..., {self.cfg.hidden_sizes[role]})) (generate() does this itself)"
                )
            if h.shape[-1] != self.cfg.hidden_sizes[role]:
                raise RouterError(
                    f"router {self.name} expects {role} hidden size {self.cfg.hidden_sizes[role]}, "
                    f"got {h.shape[-1]}: it was trained for another model pair"
                )
            if tuple(h.shape[:-1]) != tuple(lead):
                raise RouterError(
                    f"router {self.name}: the {role} hidden state has shape {tuple(h.shape)}, "
                    f"expected {(*lead, h.shape[-1])} (one state per scored position)"
                )
            parts.append(h.float())
        return parts

    @torch.no_grad()
    def candidate_scores(self, q, q_raw, p_raw, feats, q_arg=None, p_arg=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Token head: (candidate ids (..., K), predicted gap of keeping each (..., K)); the candidates are
        the drafter's top K of q (the distribution drafts are drawn from)."""
        k = min(self.cfg.token_candidates, q.shape[-1])
        cand = fast_topk_ids(q, k)  # (..., K) the drafter tokens that can be drafted
        return cand, self._candidate_gaps(feats, q_raw, p_raw, cand, q_arg, p_arg)

    @torch.no_grad()
    def _candidate_gaps(self, feats, q_raw, p_raw, cand, q_arg=None, p_arg=None) -> torch.Tensor:
        """Token head: the predicted gap (..., K) of keeping each candidate id cand (..., K), from the position
        inputs (..., D) and the candidates' features in the raw distributions (..., V)."""
        x = torch.cat(
            [feats[..., None, :].expand(*cand.shape, feats.shape[-1]), candidates_of(q_raw, p_raw, cand, q_arg, p_arg)],
            -1,
        )  # (..., K, D)
        return self.net(x.reshape(-1, x.shape[-1])).reshape(cand.shape)


# ---- the router folder (docs/router-format.md) ------------------------------------------------------------
# `save_router` writes the weights, config, golden vectors, model card and custom_generate/; `load_router`
# rebuilds a LearnedRouter with torch and safetensors alone, refusing a damaged, edited or outdated folder with
# the fix. They live with the classes they save (the Hub mixin calls them through LearnedRouter's hooks).


def save_router(router: LearnedRouter | RouterNet, folder: str | Path) -> Path:
    """Write the router folder (docs/router-format.md): model.safetensors + config.json, golden vectors
    (not for a gru), a model card (README.md) and custom_generate/ (transformers' generate); returns it."""
    from router.export.card import write_model_card
    from router.export.custom_generate import write_custom_generate
    from router.export.golden import write_golden

    router = router if isinstance(router, LearnedRouter) else LearnedRouter(router, name=Path(folder).name)
    net, folder = router.net, Path(folder)
    claim_output(folder, "train")  # never into another stage's folder or over a user's files, through any API
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STAGE_MARK).write_text("train")
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(folder / "model.safetensors"))
    exported = {**asdict(net.cfg), "weights_sha256": file_sha256(folder / "model.safetensors")}  # checked on load
    (folder / "config.json").write_text(json.dumps(exported, indent=2, default=str))
    write_custom_generate(folder)  # the folder also decodes through transformers' generate(custom_generate=...)
    write_model_card(net.cfg, router.name, folder)
    if not router.offline_only:  # an offline-only router (a gru) has no stateless decision to pin
        write_golden(router, folder)
    return folder


def load_router(folder: str | Path) -> LearnedRouter:
    """Rebuild a router saved by save_router (torch + safetensors only)."""
    folder = Path(folder)
    cfg_path, weights = folder / "config.json", folder / "model.safetensors"
    if not cfg_path.exists() or not weights.exists():
        raise RouterError(
            f"{folder} is not a router folder (needs config.json and model.safetensors): "
            f"train one with `specroute train`"
        )
    try:
        raw = json.loads(cfg_path.read_text())
    except ValueError as err:
        raise RouterError(
            f"{cfg_path} is not valid JSON ({err}): re-export the router with `specroute train`"
        ) from None
    if not isinstance(raw, dict):
        raise RouterError(
            f"{cfg_path} holds a JSON {type(raw).__name__}, not a router config (a mapping): the folder is damaged "
            f"or was edited; retrain the router (`specroute train`) or restore the folder"
        )
    if raw.get("format") != ROUTER_FORMAT or raw.get("schema_version") != SCHEMA_VERSION:
        raise RouterError(
            f"{folder} holds a router of format {raw.get('format')} / record schema "
            f"{raw.get('schema_version')}; this specroute reads format {ROUTER_FORMAT} / schema "
            f"{SCHEMA_VERSION}: retrain it"
        )
    recorded = raw.pop("weights_sha256", None)
    if recorded != file_sha256(weights):
        raise RouterError(
            f"{weights} is damaged or was changed after export (its checksum differs from the one in "
            f"{cfg_path.name}): retrain the router (`specroute train`) or restore the folder"
        )
    try:
        cfg = RouterConfig(**raw)
    except TypeError as err:
        raise RouterError(f"{cfg_path} is not a router config this version understands: {err}") from None
    check_feature_names(cfg.feature_names, folder.name)
    net = RouterNet(cfg)
    try:
        net.load_state_dict(load_file(str(weights)))
    except Exception as err:  # safetensors and torch raise several types for bad files and shapes
        raise RouterError(
            f"{weights} does not hold the weights {cfg_path.name} describes ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200]}): the folder is damaged or was edited; retrain or "
            f"restore it"
        ) from None
    return LearnedRouter(net, name=folder.name)
