"""scikit-learn baselines on the same features: logistic regression and gradient boosting."""

from __future__ import annotations

import numpy as np

from train.data import RecordSplit
from train.validation import router_metrics


def sklearn_baselines(train: RecordSplit, val: RecordSplit, seed: int, max_rows: int = 200_000) -> dict:
    from threadpoolctl import threadpool_limits

    # torch's OpenMP pool is already spinning in this process; sklearn's own OpenMP threads then
    # fight it (measured: a 1 s gradient-boosting fit took 385 s). One thread avoids that.
    with threadpool_limits(limits=1, user_api="openmp"):
        return _fit_baselines(train, val, seed, max_rows)


def _fit_baselines(train: RecordSplit, val: RecordSplit, seed: int, max_rows: int) -> dict:
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    idx = np.sort(np.random.default_rng(seed).permutation(len(train))[:max_rows])
    x, gap, w = train.flat_inputs(idx), train.y[idx].reshape(-1), train.w[idx].reshape(-1)
    val_x = val.flat_inputs(np.arange(len(val)))
    out = {}
    if len(np.unique(gap > 0)) == 2:
        logreg = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500))
        logreg.fit(x, gap > 0, logisticregression__sample_weight=w * np.abs(gap) + 1e-6)
        pred = logreg.decision_function(val_x).reshape(val.y.shape)
        out["logistic_regression"] = router_metrics(pred, val.y, val, False)
    gbm = HistGradientBoostingRegressor(max_iter=200, random_state=seed).fit(x, gap, sample_weight=w)
    out["gradient_boosting"] = router_metrics(gbm.predict(val_x).reshape(val.y.shape), val.y, val, True)
    return out
