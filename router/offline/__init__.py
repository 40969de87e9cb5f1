"""Offline analysis of records: router inputs built from records for train and eval alike
(`inputs`), exact trade-off curves of cascade-form rules (`tradeoff`) and the greedy / sampled
views with their intervals (`views`)."""
