"""The training engine, reading a run as its `specs.RunSpec` (config.resolve, once, at the
command boundary): one setup for every command (setup: `check` in one order, `build` the
objective, optimizer and abstract sharded state), the device mesh and logical-axis sharding
(sharding), train state creation and restore (state), optimizers and schedules (optim), the
objectives, registered by name (objectives: loss, batch shapes, real tokens, FLOPs; a model's
default or train.objective; contrastive: the sentence-embedding ones), the host input
pipelines that turn a config into global batches (input, asking data.sources), the loop
(train), evaluation and its evaluator registry (evaluate), Orbax checkpoints (checkpoint),
checkpoint averaging (average), metrics files (metrics) and where JAX keeps compiled programs
(compilation_cache). It may import models, data, tasks, config and the base modules (paths,
trees, log, specs); never translation, interop, cloud, viz or tools (evaluators of those live
there and are named in evaluate.EVALUATORS).
"""

from bert_jax.training import contrastive  # noqa: E402,F401 (registers the contrastive objectives)
