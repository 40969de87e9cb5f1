"""specroute core: deferral rules, speculative sampler, cascade decoding loop, model loading."""
