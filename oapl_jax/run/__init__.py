"""The front door: how a config file becomes a running system, written once.

    cfg = files.load("configs/arithmetic.py:smoke", ["--config.loop.num_syncs=2"])   # a ConfigDict
    rc = schema.from_config(cfg)        # the typed RunConfig; every bad field at once (ConfigError)
    warnings = check.check(rc)          # the cross-section rules (batch x mesh, model x mesh, lengths)
    parts = assemble.<part>(rc, ...)    # placement, task, model + params, sampler, train config, eval

Every entry point (train, offline, eval, export, serve, compile check, the study) goes through these;
below this package nothing reads a ConfigDict.
"""
