"""Programs that use the library and are imported by nothing in it: the offline demo
(`python -m bert_jax.tools.demo`, `make demo`), the benchmarks (`python -m bert_jax.tools.bench`,
`make bench`) and the model throughput benchmark beside the peers (modelbench). They may import
any part of the package.
"""
