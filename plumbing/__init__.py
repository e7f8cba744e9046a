"""The run plumbing: what every experiment needs and neither paper is about.

A reader of the papers can stop at the top level (model.py, looped.py, train_spt.py,
train_flt.py, ...) and read the names used from here by their docstrings alone:

    training.py      the training core: Run (run folder, resume, signals), Schedule, NonFiniteGuard
    spt_phase.py     the bookkeeping around train_spt.py's loop (PhaseLedger: batches, log, best, resume)
    spt_data.py      train_spt.py's one interface over synthetic.py and data_lra.py
    flt_run.py       what train_flt.py's run does around its loop (StepLedger, schedules, summary)
    runfiles.py      file safety: atomic writes, manifests, checkpoints that are finite or refused
    cost.py          the cost notice a long run prints first, and the dtype choice
    spt_settings.py  Amos et al.'s per-task values, the presets, the checks of train_spt.py's flags
    flt_settings.py  the recipes (--optim) and the checks of train_flt.py's flags
    spt_report.py    Paper A's tables and figures over run folders
    flt_report.py    Paper B's tables and figures over run folders (the rules: stability.py)
"""
