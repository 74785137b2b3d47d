"""`bert-jax embed --output <folder>` (interop/bulk_embed.py): a corpus into shards of vectors
with their ids, each shard whole or absent, resumed after a kill, split over hosts, each batch
spread over the devices; checked against one device's `Encoder.encode` of the same texts."""

import json
import os
import re

import jax
import numpy as np
import pytest
from helpers import FIXTURES

from bert_jax.interop import bulk_embed, convert, sentence_models

TEXTS = ["the cat sat on the mat", "a dog", "", "birds fly south in the winter months",
         "one", "the quick brown fox jumps over the lazy dog", "   ", "rain", "sun and moon",
         "a b c d e f g h", "last line"]
MEAN = sentence_models.SentenceSpec(pooling="mean", normalize=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny TF BERT of the fixtures, converted (a 100-token vocab, 16 positions)."""
    out = tmp_path_factory.mktemp("embed") / "ckpt"
    convert.convert_hf(FIXTURES / "tf_bert_tiny", out)
    return str(out)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def one_device(checkpoint):
    """The texts' vectors by one device, in the corpus's order (blank lines have none)."""
    kept = [t for t in TEXTS if t.strip()]
    encoder = sentence_models.Encoder(checkpoint, MEAN, devices=jax.local_devices()[:1])
    return encoder.encode(kept, batch_size=4)


class Killed(BaseException):
    """The process ending where it is (nothing after it runs)."""


def embed(checkpoint, corpus, out, **kw):
    return bulk_embed.embed_to_shards(checkpoint, corpus, str(out), shard_size=3, batch_size=4,
                                      spec=MEAN, **kw)


def test_shards_hold_every_text_with_its_line_number_as_one_device_embeds_it(
        checkpoint, corpus, one_device, tmp_path):
    assert jax.local_device_count() == 8  # each batch of 4 (rounded up to 8) spread over 8
    report = embed(checkpoint, corpus, tmp_path / "out")
    assert report == {"rows": 9, "shards": 3, "written": 3, "kept": 0,
                      "output": str(tmp_path / "out")}
    assert sorted(os.listdir(tmp_path / "out")) == [
        "embed.json", "part-00000-of-00003.npz", "part-00000-of-00003.npz.crc32",
        "part-00001-of-00003.npz", "part-00001-of-00003.npz.crc32",
        "part-00002-of-00003.npz", "part-00002-of-00003.npz.crc32"]
    ids, vectors = bulk_embed.load(tmp_path / "out")
    assert ids == [str(i + 1) for i, t in enumerate(TEXTS) if t.strip()]  # line numbers
    np.testing.assert_allclose(vectors, one_device, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-6)
    manifest = json.loads((tmp_path / "out" / "embed.json").read_text())
    assert manifest["rows"] == 9 and manifest["sentence"]["pooling"] == "mean"


def test_a_killed_run_resumes_embedding_only_the_shards_not_written(
        checkpoint, corpus, one_device, tmp_path, monkeypatch):
    """A kill after shard 1's bytes are written but before they are renamed into place: the
    shard is absent (load names it), the partial file is never read; the run again embeds
    shards 1 and 2 only and gives the one-device vectors."""
    real_replace = os.replace

    def killed_at_the_second(src, dst):
        if dst.endswith("part-00001-of-00003.npz"):
            raise Killed  # as a kill leaves it: the partial file, no shard
        real_replace(src, dst)

    monkeypatch.setattr(bulk_embed.os, "replace", killed_at_the_second)
    with pytest.raises(Killed):
        embed(checkpoint, corpus, tmp_path / "out")
    monkeypatch.setattr(bulk_embed.os, "replace", real_replace)
    assert (tmp_path / "out" / ".part-00001-of-00003.npz.partial").exists()
    with pytest.raises(FileNotFoundError, match="part-00001-of-00003.npz: missing; run the same"):
        bulk_embed.load(tmp_path / "out")

    encoded = []
    real_encode = sentence_models.Encoder.encode
    monkeypatch.setattr(sentence_models.Encoder, "encode",
                        lambda self, texts, b=32: encoded.append((self.rows.mesh.size, *texts))
                        or real_encode(self, texts, b))
    report = embed(checkpoint, corpus, tmp_path / "out")
    assert (report["written"], report["kept"]) == (2, 1)
    assert encoded == [(8, "one", "the quick brown fox jumps over the lazy dog", "rain"),
                       (8, "sun and moon", "a b c d e f g h", "last line")]  # over 8 devices
    ids, vectors = bulk_embed.load(tmp_path / "out")
    assert len(ids) == 9
    np.testing.assert_allclose(vectors, one_device, atol=1e-6)
    assert embed(checkpoint, corpus, tmp_path / "out")["written"] == 0  # all there: nothing to do


def test_two_hosts_write_disjoint_shards_that_together_are_the_corpus(
        checkpoint, corpus, one_device, tmp_path):
    """Host 1 first, into its own folder (a host's local disk): its shard and the manifest,
    which every host writes, so that its rerun resumes; then both into one folder."""
    second = embed(checkpoint, corpus, tmp_path / "host1", process_index=1, process_count=2)
    assert (second["written"], sorted(os.listdir(tmp_path / "host1"))) == (
        1, ["embed.json", "part-00001-of-00003.npz", "part-00001-of-00003.npz.crc32"])
    assert embed(checkpoint, corpus, tmp_path / "host1", process_index=1, process_count=2)["kept"] == 1
    first = embed(checkpoint, corpus, tmp_path / "out", process_index=0, process_count=2)
    assert (first["written"], sorted(os.listdir(tmp_path / "out"))) == (
        2, ["embed.json", "part-00000-of-00003.npz", "part-00000-of-00003.npz.crc32",
            "part-00002-of-00003.npz", "part-00002-of-00003.npz.crc32"])
    with pytest.raises(FileNotFoundError, match="part-00001"):
        bulk_embed.load(tmp_path / "out")
    assert embed(checkpoint, corpus, tmp_path / "out", process_index=1, process_count=2)["written"] == 1
    np.testing.assert_allclose(bulk_embed.load(tmp_path / "out")[1], one_device, atol=1e-6)


def test_the_command_splits_the_shards_over_the_processes_jax_counts(checkpoint, corpus, tmp_path,
                                                                   cli, monkeypatch):
    """`bert-jax embed` starts the distributed runtime, then as process 1 of 2 writes only its
    shard; a .npy output (one file) is refused with several processes."""
    from bert_jax.commands import interop

    started = []
    monkeypatch.setattr(interop, "maybe_initialize_distributed", started.append)
    assert bulk_embed.hosts() == (0, 1)
    monkeypatch.setattr(bulk_embed, "hosts", lambda: (1, 2))
    code, out, err = cli(["embed", f"--checkpoint={checkpoint}", f"--input={corpus}",
                          f"--output={tmp_path / 'out'}", "--shard_size=3", "--pooling=mean"])
    assert code == 0, err
    assert started == ["embed"]
    assert sorted(os.listdir(tmp_path / "out")) == ["embed.json", "part-00001-of-00003.npz",
                                                    "part-00001-of-00003.npz.crc32"]
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    code, out, err = cli(["embed", f"--checkpoint={checkpoint}", f"--input={corpus}",
                          f"--output={tmp_path / 'v.npy'}"])
    assert code == 1 and "a .npy --output is one process's" in err


def test_a_damaged_shard_is_one_line_naming_it(checkpoint, corpus, tmp_path):
    embed(checkpoint, corpus, tmp_path / "out")
    shard = tmp_path / "out" / "part-00001-of-00003.npz"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"part-00001-of-00003.npz: not a whole shard .*remove that file"):
        embed(checkpoint, corpus, tmp_path / "out")
    with pytest.raises(ValueError, match=r"part-00001-of-00003.npz: not a whole shard"):
        bulk_embed.load(tmp_path / "out")


def test_a_folder_of_another_embedding_is_refused_and_its_shards_kept(checkpoint, corpus, tmp_path):
    embed(checkpoint, corpus, tmp_path / "out")
    before = {f: (tmp_path / "out" / f).read_bytes() for f in os.listdir(tmp_path / "out")}
    with pytest.raises(ValueError, match=r"shard_size=3.*this run has shard_size=4.*choose a new "
                                         r"--output \(the shards there are kept\)"):
        bulk_embed.embed_to_shards(checkpoint, corpus, str(tmp_path / "out"), shard_size=4, spec=MEAN)
    other = tmp_path / "other.txt"
    other.write_text("another corpus\n")
    with pytest.raises(ValueError, match=r"made from another input: '.*' then, '.*other.txt' now, "
                                         r"whose ids or texts differ: one folder holds one embedding"):
        embed(checkpoint, str(other), tmp_path / "out")
    with pytest.raises(ValueError, match="made with sentence.pooling='mean', sentence.normalize=True; "
                                         "this run has sentence.pooling='cls', sentence.normalize=False"):
        bulk_embed.embed_to_shards(checkpoint, corpus, str(tmp_path / "out"), shard_size=3)
    assert before == {f: (tmp_path / "out" / f).read_bytes() for f in os.listdir(tmp_path / "out")}
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="files but no embed.json"):
        embed(checkpoint, corpus, tmp_path / "notes")


def test_a_beir_corpus_embeds_title_and_text_under_its_ids(checkpoint, one_device, tmp_path, cli):
    rows = [{"_id": f"doc{i}", "title": "", "text": t} for i, t in enumerate(TEXTS) if t.strip()]
    rows[0] = {"_id": "doc0", "title": "the cat", "text": "sat on the mat"}  # "the cat sat on ..."
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = cli(["embed", f"--checkpoint={checkpoint}", f"--input={tmp_path / 'corpus.jsonl'}",
                          f"--output={tmp_path / 'out'}", "--shard_size=4", "--batch_size=4",
                          "--pooling=mean"])
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["shards"] == 3
    ids, vectors = bulk_embed.load(tmp_path / "out")
    assert ids == [r["_id"] for r in rows]
    # MEAN normalises, --pooling=mean keeps the checkpoint's (none): compare directions
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    np.testing.assert_allclose(unit, one_device, atol=1e-6)


@pytest.mark.parametrize("lines, message", [
    (['{"_id": "a", "text": "x"}', '{"_id": "a", "text": "y"}'],
     r"corpus.jsonl:2: field '_id': 'a' twice \(first on line 1\)"),
    (['{"_id": "a", "title": "t"}'], r"corpus.jsonl:1: field 'text' missing or not a string"),
    (['{"_id": 7, "text": "x"}'], r"corpus.jsonl:1: field '_id' missing or not a string"),
    (['{"_id": "a", "text": "  ", "title": ""}'], r"corpus.jsonl:1: field 'text' is empty"),
    (['{"_id": "a", "text": "x", "title": 3}'], r"corpus.jsonl:1: field 'title' is not a string"),
    (['', '{"_id": "a", "text": "x"', ''], r"corpus.jsonl:2: not JSON"),
    (['', ' '], r"corpus.jsonl: no text to embed"),
])
def test_a_bad_corpus_is_one_line_naming_file_line_and_field(tmp_path, lines, message):
    (tmp_path / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=message):
        bulk_embed.read_corpus(str(tmp_path / "corpus.jsonl"))


def _resave(vectors=lambda v: v, ids=lambda i: i):
    def change(shard):
        with np.load(shard) as z:
            got_ids, got = z["ids"], z["vectors"]
        np.savez(shard, ids=ids(got_ids), vectors=vectors(got))
    return change


@pytest.mark.parametrize("change, says", [
    (_resave(lambda v: v[:, :5]), r"vectors float32 \(3, 5\), expected float32 \(3, 32\)"),
    (_resave(lambda v: v[:1]), r"vectors float32 \(1, 32\), expected float32 \(3, 32\)"),
    (_resave(lambda v: v.astype(np.float64)), r"vectors float64 \(3, 32\), expected float32"),
    (_resave(ids=lambda i: np.arange(len(i))), r"ids of type int64 .*expected strings"),
])
def test_a_shard_of_another_shape_or_type_is_not_kept(checkpoint, corpus, tmp_path, change, says):
    # A shard replaced by hand with one of another width, row count or type would be "kept"
    # by a resume and break (or silently skew) what load returns: refused by name, as damage.
    # Its CRC32 record removed, as in a folder of an older version (with it: the next test).
    embed(checkpoint, corpus, tmp_path / "out")
    shard = tmp_path / "out" / "part-00001-of-00003.npz"
    change(shard)
    (tmp_path / "out" / "part-00001-of-00003.npz.crc32").unlink()
    kept = shard.read_bytes()
    message = r"part-00001-of-00003.npz: not a whole shard \(" + says + r".*remove that file"
    with pytest.raises(ValueError, match=message):
        embed(checkpoint, corpus, tmp_path / "out")
    with pytest.raises(ValueError, match=message):
        bulk_embed.load(tmp_path / "out")
    assert shard.read_bytes() == kept


def test_a_shard_changed_since_it_was_written_is_not_kept(checkpoint, corpus, tmp_path):
    """A whole shard whose vectors were made NaN after embed wrote it (or any other change): a
    resume and load compare its bytes with the CRC32 written beside it and name it; in a
    folder of an older version (no CRC32 files) a resume reads the kept shards' vectors, and
    refuses the NaN ones. Nothing in the folder is changed by the refusals."""
    embed(checkpoint, corpus, tmp_path / "out")
    shard = tmp_path / "out" / "part-00002-of-00003.npz"
    _resave(lambda v: np.full_like(v, np.nan))(shard)
    before = {f: (tmp_path / "out" / f).read_bytes() for f in os.listdir(tmp_path / "out")}
    changed = (r"part-00002-of-00003.npz: not a whole shard \(changed since embed wrote it: [\d,]+ "
               r"bytes of CRC32 [0-9a-f]{8}, written as [\d,]+ bytes of CRC32 [0-9a-f]{8}\); remove "
               r"that file and run the same `bert-jax embed` again")
    with pytest.raises(ValueError, match=changed):
        embed(checkpoint, corpus, tmp_path / "out")
    with pytest.raises(ValueError, match=changed):
        bulk_embed.load(tmp_path / "out")
    for name in os.listdir(tmp_path / "out"):  # as an older version wrote the folder
        if name.endswith(".crc32"):
            (tmp_path / "out" / name).unlink()
    not_finite = r"part-00002-of-00003.npz: not a whole shard \(3 vectors not finite\); remove"
    with pytest.raises(ValueError, match=not_finite):
        embed(checkpoint, corpus, tmp_path / "out")
    with pytest.raises(ValueError, match=not_finite):
        bulk_embed.load(tmp_path / "out")
    assert {f: (tmp_path / "out" / f).read_bytes() for f in os.listdir(tmp_path / "out")} == {
        f: data for f, data in before.items() if not f.endswith(".crc32")}
    shard.unlink()  # as the line says: the next run embeds it again, with its CRC32
    assert embed(checkpoint, corpus, tmp_path / "out")["written"] == 1
    assert len(bulk_embed.load(tmp_path / "out")[0]) == 9


def test_a_damaged_crc32_record_is_named(checkpoint, corpus, tmp_path):
    embed(checkpoint, corpus, tmp_path / "out")
    (tmp_path / "out" / "part-00000-of-00003.npz.crc32").write_text('{"size": 10}')
    with pytest.raises(ValueError, match=r"part-00000-of-00003.npz.crc32: no key 'crc32' \(a string\); "
                                         r"embed wrote it with part-00000-of-00003.npz: remove both files"):
        embed(checkpoint, corpus, tmp_path / "out")


def test_vectors_not_finite_are_never_written(checkpoint, corpus, tmp_path, monkeypatch):
    """A checkpoint that gives NaN for a text: embed stops naming it and the ids, writes nothing
    for that shard and keeps the shards before it."""
    real_encode = sentence_models.Encoder.encode

    def nan_for_rain(self, texts, batch_size=32):
        vectors = real_encode(self, texts, batch_size)
        return np.where(np.array([t == "rain" for t in texts])[:, None], np.nan, vectors)

    monkeypatch.setattr(sentence_models.Encoder, "encode", nan_for_rain)
    said = (re.escape(checkpoint) + r": gives vectors that are not finite \(NaN or infinity\) for 1 "
            r"of the texts of shard 1 \(ids 8\); .*part-00001-of-00003.npz not written \(the shards "
            r"before it are kept\): check that checkpoint")
    with pytest.raises(ValueError, match=said):
        embed(checkpoint, corpus, tmp_path / "out")
    assert sorted(os.listdir(tmp_path / "out")) == [
        "embed.json", "part-00000-of-00003.npz", "part-00000-of-00003.npz.crc32"]


@pytest.mark.parametrize("edit, says", [
    (lambda m: m.update(shard_size="3"), "key 'shard_size' is \"3\", expected an integer >= 1"),
    (lambda m: m.pop("fingerprint"), "no key 'fingerprint' \\(a string\\)"),
    (lambda m: m.update(shards=7), "shards=7 is not the 9 rows in shards of 3"),
    (lambda m: m.update(sentence=None), "key 'sentence' is null, expected an object"),
    (lambda m: m["sentence"].pop("pooling"), "no key 'sentence.pooling' \\(a string\\)"),
    (lambda m: m["sentence"].update(max_seq_length=2),
     "key 'sentence.max_seq_length' is 2, expected an integer >= 3"),
])
def test_an_embed_json_edited_by_hand_is_named_with_its_key(checkpoint, corpus, tmp_path, edit, says):
    embed(checkpoint, corpus, tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / "embed.json").read_text())
    edit(manifest)
    (tmp_path / "out" / "embed.json").write_text(json.dumps(manifest))
    before = {f: (tmp_path / "out" / f).read_bytes() for f in os.listdir(tmp_path / "out")}
    with pytest.raises(ValueError, match=f"embed.json: {says}; embed wrote it .*the shards there "
                                         "are kept"):
        embed(checkpoint, corpus, tmp_path / "out")
    with pytest.raises(ValueError, match=f"embed.json: {says}; .* is not a folder"):
        bulk_embed.load(tmp_path / "out")
    assert before == {f: (tmp_path / "out" / f).read_bytes() for f in os.listdir(tmp_path / "out")}


def test_a_shard_written_again_replaces_the_record_of_the_one_removed(tmp_path):
    """A shard removed to be embedded again leaves its .crc32 behind; if the next run is
    killed between writing the shard and its record, the old record must not condemn the new
    shard: writing a shard removes the stale record first."""
    vectors = np.ones((2, 3), np.float32)
    bulk_embed._write_shard(str(tmp_path), "part-0-of-1.npz", ["a", "b"], vectors)
    (tmp_path / "part-0-of-1.npz").unlink()  # as the error line says to
    real_write = bulk_embed._write
    calls = []

    def killed_before_the_record(folder, name, data):
        calls.append(name)
        if name.endswith(bulk_embed.SUM):
            raise KeyboardInterrupt  # killed between the shard and its record
        real_write(folder, name, data)

    bulk_embed._write = killed_before_the_record
    try:
        with pytest.raises(KeyboardInterrupt):
            bulk_embed._write_shard(str(tmp_path), "part-0-of-1.npz", ["a", "b"], 2 * vectors)
    finally:
        bulk_embed._write = real_write
    assert calls == ["part-0-of-1.npz", "part-0-of-1.npz.crc32"]
    ids, got = bulk_embed._read_shard(tmp_path / "part-0-of-1.npz", 3)  # no record: read, checked
    assert list(ids) == ["a", "b"] and (got == 2).all()
