"""The lab: everything that trains, evaluates, benchmarks and judges the library's models, one folder per family.

``polymixer.experiments.<family>`` holds that family's data loaders and offline default (``data.py``, ``synth.py``),
its task and commands (``task.py``: ``polymixer train / eval / … <family>``), its benchmark (``bench.py``) and its
comparison with attention and targets (``targets.py``, judged by ``polymixer bench parity``); its guide is
``docs/<family>.md`` and its results ``docs/bench/<family>*``; what
the families share sits beside them: the one training loop (``train/``), the data check and presets (``tasks/``),
the cache and bad-sample policy (``data/``), the cross-family benches and the parity judge (``bench/``), figures
(``report.py``), metrics and the command line (``cli.py``). The library (``polymixer`` outside this folder) never
imports from here: ``tests/test_layout.py`` checks the border.
"""
