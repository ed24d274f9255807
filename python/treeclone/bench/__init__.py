"""Training-loop benchmarks: ``python -m treeclone.bench`` (or ``treeclone-bench``).

Times real training steps (an MLP, a 12-layer transformer, tied embeddings, fine-tuning with
frozen parameters, and the "optimizer mutated in place" pattern) under ``jax.jit``,
``treeclone.jit`` (policies ``clone``, ``alias``, ``strict``), ``flax.nnx.jit`` and
``equinox.filter_jit``, with donation (``--only donated``) and an equinox model under
``traced="arrays"`` (``--only equinox``), after checking that every contender computes the
same thing. Writes ``results.json``, ``report.md`` and ``bench.png``. See
``python -m treeclone.bench --help``.

Needs the ``bench`` extra: ``pip install 'treeclone[bench]'`` (flax, equinox, optax,
matplotlib); flax, equinox and matplotlib are optional (reported as skipped when missing),
optax is required.
"""
