"""A deterministic simulation of the bridge over the in-memory log (development tooling).

Not part of the runtime package (``pyproject.toml`` packages ``bridge*`` only, and the image
installs nothing else): it needs the in-memory log, a virtual-time event loop and the checker,
and it is run from a checkout, by the tests (``tests/test_simulation.py``), by the bench
(``bench/bench_simulation.py``) and by hand: ``python -m simulation --seed N`` replays one seed.
"""
