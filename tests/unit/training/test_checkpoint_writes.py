"""How a checkpoint's arrays are written: replicated arrays split among their replicas only
where each slice is large (checkpoint.MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL)."""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax.training import checkpoint


def test_small_replicated_arrays_are_written_whole_and_large_ones_split_among_replicas(
        tmp_path, monkeypatch):
    """Orbax's replica-parallel saving slices a replicated array on the device, one op per
    replica (compiled at each new shape): for the many small arrays of a model that costs more
    than writing them (a tiny BERT on 8 devices: 700 slices, 4 s a save). Below the gate an
    array is written by one replica; a 1 MiB-per-replica array is still split 8 ways."""
    assert len(jax.devices()) == 8
    replicated = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec())
    gate = checkpoint.MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL
    large_rows = 8 * gate // (4 * 64)  # float32 [rows, 64]: `gate` bytes per replica's slice
    tree = {"small": {f"w{i}": jax.device_put(jnp.full((16, 8), float(i)), replicated) for i in range(5)},
            "large": jax.device_put(jnp.arange(large_rows * 64, dtype=jnp.float32).reshape(large_rows, 64),
                                    replicated)}
    sliced = []
    slice_in_dim = jax.lax.slice_in_dim

    def counting(operand, *args, **kwargs):
        sliced.append(operand.shape)
        return slice_in_dim(operand, *args, **kwargs)

    monkeypatch.setattr(jax.lax, "slice_in_dim", counting)
    with checkpoint.manager(tmp_path, create=True) as mngr:
        mngr.save(1, args=ocp.args.Composite(params=ocp.args.StandardSave(tree)))
        mngr.wait_until_finished()
    assert sliced == [(large_rows, 64)] * 8  # the large array by its 8 replicas, the small whole
    with checkpoint.manager(tmp_path) as mngr:
        back = mngr.restore(1, args=ocp.args.Composite(params=ocp.args.StandardRestore(tree)))["params"]
    for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(tree), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_runs_of_several_processes_keep_orbax_replica_parallel_writes(monkeypatch):
    """With several processes the slices of a replicated array spread the writing over the
    hosts, so the gate is left to one-process runs: Orbax's handler stays as it was."""
    default = ocp.type_handlers.ArrayHandler()
    ocp.type_handlers.register_type_handler(jax.Array, default, override=True)
    try:
        monkeypatch.setattr(jax, "process_count", lambda: 2)
        checkpoint._gate_replica_parallel_writes()
        assert ocp.type_handlers.get_type_handler(jax.Array) is default
        monkeypatch.setattr(jax, "process_count", lambda: 1)
        checkpoint._gate_replica_parallel_writes()
        gated = ocp.type_handlers.get_type_handler(jax.Array)
        assert gated is not default
        assert gated._min_slice_bytes_for_replica_parallel == checkpoint.MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL
    finally:
        monkeypatch.undo()
        checkpoint._gate_replica_parallel_writes()


def test_a_save_error_no_storage_raises_is_not_called_a_storage_fault(tmp_path):
    """A failed save is one line "fix the storage" only for what storage raises (an OSError);
    a missing key (e.g. a metric the checkpoints were not ranked by) stays itself."""
    ckpt = checkpoint.TrainCheckpointer(tmp_path, keep=1)
    try:
        missing = KeyError("eval/f1")
        assert ckpt._write_error(missing) is missing
        full = ckpt._write_error(OSError(28, "No space left on device"))
        assert str(full).startswith(f"cannot write a checkpoint in {tmp_path}/checkpoints (No space "
                                    "left on device); fix the storage")
    finally:
        ckpt.close()


def test_a_checkpoint_saved_without_the_best_metric_ranks_below_every_score(tmp_path):
    """A workdir whose checkpoints were scored by another metric (another task's, an older
    version's): the save ranks them below every number, never a KeyError inside the save."""
    tree = {"w": jnp.ones((2,))}
    with checkpoint.TrainCheckpointer(tmp_path, keep=1, best_metric="eval/f1") as ckpt:
        ckpt.save(1, tree, tree, {}, {}, metrics={"eval/accuracy": 0.9})
        ckpt.wait()
        ckpt.save(2, tree, tree, {}, {}, metrics={"eval/f1": 0.1})
        ckpt.save(3, tree, tree, {}, {}, metrics={"eval/f1": 0.0})
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [2, 3]


def test_a_save_that_raises_after_its_write_began_is_still_finalized(tmp_path, monkeypatch):
    """An error raised by Orbax's save after it dispatched the write (the step's folder made):
    the write goes on and is finalized with its checksums, not left to a finalization that
    finds no step (IndexError) and a tmp folder; the error itself is not called storage's."""
    tree = {"w": jnp.ones((2,))}
    ckpt = checkpoint.TrainCheckpointer(tmp_path, keep=2)
    save = ckpt.manager.save

    def raising_after_the_dispatch(*args, **kwargs):
        save(*args, **kwargs)
        raise KeyError("after the dispatch")
    monkeypatch.setattr(ckpt.manager, "save", raising_after_the_dispatch)
    try:
        with pytest.raises(KeyError):
            ckpt.save(1, tree, tree, {}, {})
        ckpt.wait()
    finally:
        ckpt.close()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1"]
    assert (tmp_path / "checkpoints" / "1" / "checksums.json").is_file()
