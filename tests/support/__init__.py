"""Helpers the tests share (no tests here), imported as `support.<module>` (pytest puts `tests/` on `sys.path`).

- `processes`: the repository root, free ports, waiting for an HTTP process, the environment of a child Python;
- `search`: the search tests' toy corpus and the search server run as a real process;
- `forced_ppo`: a tiny synthetic world and a short PPO run whose turns are forced (viewer and hardening tests);
- `sample_runs`: the runs and the unseen world that `searchrl view / audit / report / eval` are tested on;
- `smollm2`: the one real-model (SmolLM2) import of a session, as fixtures that conftest.py registers;
- `benchmarks`: a script of `benchmarks/` loaded as a module (`load_benchmark`).

The toy worlds and tiny model configurations many modules train in are `tests/worlds.py`; conftest.py turns
them into fixtures.
"""
