"""The labels' noise ceiling: what re-drawn answer-level labels say about how predictable the greedy ones are.

Input: per tested mismatch i, K verdicts (1 correct, 0 wrong) of continuations sampled after the draft
(d[i, k]) and K after the verifier's token (v[i, k]) (data_gen/noise.py), the greedy label's sign
s[i] (HARM -1, NEUTRAL 0, RESCUE +1), its problem and a weight (sample -> recording population). Derived:

- a_d, a_v: the chance that an answer continued after d (after v) is right; their K-sample means;
- the flip probability f = a_d (1 - a_v) + a_v (1 - a_d): the chance that two independent continuations,
  one per side, disagree on the verdict (what "important" is one draw of); from independent samples
  f_hat = mean_d (1 - mean_v) + mean_v (1 - mean_d) is unbiased for it;
- the accuracy change of keeping the draft, delta = a_d - a_v (what a signed label is one draw of).

Reported (docs/method.md, "The labels' noise ceiling"):
- re-draw agreement: sample k of each side makes a label again (important where d[i, k] != v[i, k], its
  sign d - v); how often it says what the greedy label says, per greedy class;
- the ceiling AUC: were the greedy label a draw of Bernoulli(f), the best any predictor could do is to
  rank by f itself; its expected AUC is sum_{i != j} w_i w_j f_i (1 - f_j) [f_i > f_j] (ties 1/2) over the
  same sum without the indicator. Beside it, the AUC f_hat reaches on the greedy labels themselves;
- the problem random effect: the share of the variance of delta (and f) between problems, from a one-way
  random-effects ANOVA on the mismatch estimates, after taking off the estimates' own sampling noise
  (var(mean) = a (1 - a) / (K - 1) per side, unbiased); against it, the out-of-fold R^2 (folds by problem)
  of token-level inputs, and of the problem's other mismatches' mean, as shares of the same true variance.
Intervals: percentile bootstrap over problems.
"""

from __future__ import annotations

import numpy as np

from router.labels import SIGNED_LABELS

BOOTSTRAP = 1000


def side_means(d: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per mismatch (n,) the share of right answers after the draft and after the verifier's token, from
    verdicts (n, K)."""
    return np.asarray(d, np.float64).mean(1), np.asarray(v, np.float64).mean(1)


def flip_and_delta(d: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(f_hat, delta_hat) (n,): the flip probability and the accuracy change of keeping the draft."""
    a_d, a_v = side_means(d, v)
    return a_d * (1 - a_v) + a_v * (1 - a_d), a_d - a_v


def sampling_noise(d: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(n,) unbiased estimate of var(delta_hat) over the K samples: a (1 - a) / (K - 1) per side, summed."""
    k = np.asarray(d).shape[1]
    a_d, a_v = side_means(d, v)
    return (a_d * (1 - a_d) + a_v * (1 - a_v)) / (k - 1)


def redraw_agreement(d: np.ndarray, v: np.ndarray, sign: np.ndarray, w: np.ndarray) -> dict:
    """How often one re-drawn label (sample k of each side) says what the greedy one says: per greedy class
    the share re-drawn important and the share re-drawn with the same sign, and over all mismatches (weighted
    by w) the share whose important / harmless verdict agrees."""
    d, v, sign, w = np.asarray(d), np.asarray(v), np.asarray(sign), np.asarray(w, np.float64)
    redrawn = d.astype(np.int64) - v  # (n, K) signs of the re-drawn labels
    important = (redrawn != 0).mean(1)  # (n,) over k
    same_sign = (redrawn == sign[:, None]).mean(1)
    agree = np.where(sign != 0, important, 1 - important)
    out = {"agreement": float(np.sum(w * agree) / np.sum(w))}
    for name, value in SIGNED_LABELS.items():
        at = sign == value
        out[name] = {
            "mismatches": int(at.sum()),
            "redrawn_important": float(important[at].mean()) if at.any() else float("nan"),
            "redrawn_same_sign": float(same_sign[at].mean()) if at.any() else float("nan"),
        }
    return out


def weighted_auc(score: np.ndarray, label: np.ndarray, w: np.ndarray) -> float:
    """AUC of `score` for binary `label` with example weights w (ties count half); NaN with one class only."""
    from sklearn.metrics import roc_auc_score

    label = np.asarray(label).astype(bool)
    if label.all() or not label.any():
        return float("nan")
    return float(roc_auc_score(label, np.asarray(score, np.float64), sample_weight=np.asarray(w, np.float64)))


def expected_auc(f: np.ndarray, w: np.ndarray) -> float:
    """The expected AUC of ranking by f when each label is a Bernoulli(f_i) draw (pairs i != j, weights w):
    the best AUC any predictor of such labels can reach."""
    f, w = np.asarray(f, np.float64), np.asarray(w, np.float64)
    pair = (w * f)[:, None] * (w * (1 - f))[None]  # (n, n) weight of "i positive, j negative"
    np.fill_diagonal(pair, 0.0)
    above = (f[:, None] > f[None]) + 0.5 * (f[:, None] == f[None])
    total = pair.sum()
    return float((pair * above).sum() / total) if total > 0 else float("nan")


def problem_share(x: np.ndarray, noise: np.ndarray, problem: np.ndarray) -> dict:
    """One-way random-effects ANOVA of estimates x (n,) by problem (method of moments, unequal groups), with
    their known sampling noise (n,) taken off the within-problem part. Returns the between-problem variance,
    the true within-problem variance (floored at 0) and the problem's share of the true variance."""
    x, noise = np.asarray(x, np.float64), np.asarray(noise, np.float64)
    _, group = np.unique(problem, return_inverse=True)
    sizes = np.bincount(group)
    means = np.bincount(group, weights=x) / sizes
    n, g = len(x), len(sizes)
    if g < 2 or n <= g:
        return {"between": float("nan"), "within": float("nan"), "share": float("nan")}
    msw = np.sum((x - means[group]) ** 2) / (n - g)
    msb = np.sum(sizes * (means - x.mean()) ** 2) / (g - 1)
    n0 = (n - np.sum(sizes**2) / n) / (g - 1)  # the effective group size of unequal groups
    between = max(0.0, (msb - msw) / n0)
    within = max(0.0, msw - noise.mean())
    total = between + within
    return {"between": between, "within": within, "share": between / total if total > 0 else float("nan")}


def true_variance(x: np.ndarray, noise: np.ndarray) -> float:
    """The variance of the estimates x less their mean sampling noise (floored at 0)."""
    return max(0.0, float(np.var(np.asarray(x, np.float64), ddof=1) - np.mean(noise)))


def leave_one_out_mean(x: np.ndarray, problem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per mismatch the mean of x over the other mismatches of its problem, and whether there are any."""
    _, group = np.unique(problem, return_inverse=True)
    sums, sizes = np.bincount(group, weights=x), np.bincount(group)
    others = sizes[group] - 1
    return np.where(others > 0, (sums[group] - x) / np.maximum(others, 1), 0.0), others > 0


def out_of_fold_r2(inputs: np.ndarray, x: np.ndarray, problem: np.ndarray, folds: int = 5, seed: int = 0) -> float:
    """R^2 of a ridge regression of x (n,) on inputs (n, F), out of fold with folds by problem (a problem's
    mismatches are never both trained on and predicted)."""
    from sklearn.linear_model import RidgeCV
    from sklearn.model_selection import GroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = np.asarray(x, np.float64)
    pred = np.zeros_like(x)
    _, group = np.unique(problem, return_inverse=True)
    order = np.random.default_rng(seed).permutation(group.max() + 1)  # shuffles which problems share a fold
    for train, test in GroupKFold(n_splits=min(folds, group.max() + 1)).split(inputs, x, order[group]):
        model = make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-3, 3, 13)))
        pred[test] = model.fit(inputs[train], x[train]).predict(inputs[test])
    return float(1 - np.sum((x - pred) ** 2) / np.sum((x - x.mean()) ** 2))


def ceiling_numbers(d, v, sign, w, problem) -> dict:
    """The figures that need no inputs: agreement, AUCs, the problem share (for one bootstrap replicate too)."""
    f, delta = flip_and_delta(d, v)
    noise = sampling_noise(d, v)
    return {
        "agreement": redraw_agreement(d, v, sign, w)["agreement"],
        "ceiling_auc": expected_auc(f, w),
        "flip_auc_on_greedy": weighted_auc(f, sign != 0, w),
        "problem_share_delta": problem_share(delta, noise, problem)["share"],
        "problem_share_flip": problem_share(f, noise, problem)["share"],
    }


def bootstrap_problems(d, v, sign, w, problem, reps: int = BOOTSTRAP, seed: int = 0) -> dict[str, list[float]]:
    """95% percentile intervals of ceiling_numbers over problems resampled with replacement (a problem's
    mismatches move together; a problem drawn twice counts as two problems)."""
    ids, group = np.unique(problem, return_inverse=True)
    members = [np.nonzero(group == g)[0] for g in range(len(ids))]
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {}
    for _ in range(reps):
        picked = rng.integers(0, len(ids), len(ids))
        rows = np.concatenate([members[g] for g in picked])
        fresh = np.concatenate([np.full(len(members[g]), j) for j, g in enumerate(picked)])
        for name, value in ceiling_numbers(d[rows], v[rows], sign[rows], w[rows], fresh).items():
            draws.setdefault(name, []).append(value)
    return {name: [float(np.nanpercentile(x, 2.5)), float(np.nanpercentile(x, 97.5))] for name, x in draws.items()}


def explained_shares(x: np.ndarray, noise: np.ndarray, problem: np.ndarray, token_inputs: np.ndarray) -> dict:
    """Out-of-fold R^2 of x from token-level inputs, from the problem's other mismatches (leave-one-out
    mean), and from both, each also as a share of x's true (noise-free) variance."""
    loo, has = leave_one_out_mean(x, problem)
    problem_inputs = np.stack([loo, has.astype(np.float64)], 1)
    reliability = true_variance(x, noise) / max(float(np.var(x, ddof=1)), 1e-12)
    out = {"reliability": reliability}
    for name, inputs in (
        ("token", token_inputs),
        ("problem_others", problem_inputs),
        ("token_and_problem", np.concatenate([token_inputs, problem_inputs], 1)),
    ):
        r2 = out_of_fold_r2(inputs, x, problem)
        out[name] = {"r2": r2, "share_of_true_variance": r2 / reliability if reliability > 0 else float("nan")}
    return out
