"""The training engine: the device mesh and logical-axis sharding (sharding), train state
creation and restore (state), optimizers and schedules (optim), the objective of each model
(objectives: loss, batch shapes, real tokens, FLOPs), the host input pipelines that turn a
config into global batches (input), the loop (train), evaluation and its evaluator registry
(evaluate), Orbax checkpoints (checkpoint), checkpoint averaging (average), metrics files
(metrics) and where JAX keeps compiled programs (compilation_cache). It may import models,
data, tasks, config and the base modules (paths, trees, log); never translation, interop,
cloud, viz or tools (evaluators of those live there and are named in evaluate.EVALUATORS).
"""
