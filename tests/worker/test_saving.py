"""The reference file written a chunk at a time (gatekeeper.worker.saving): it loads as
torch.save's does, and a first call's outputs parked in a file are not all resident
while it is written."""

from __future__ import annotations

import pytest
import torch

from gatekeeper.worker.filed import let_go, on_disk
from gatekeeper.worker.outputs import Outputs
from gatekeeper.worker.parity import load_reference, save_reference
from gatekeeper.worker.placement import FileMaps
from gatekeeper.worker.saving import save


def _rss() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_document_saved_by_chunks_loads_as_torch_saves_does(tmp_path):
    """Large and small tensors, float64, bfloat16, bool and integers, a view sharing
    another leaf's storage, a transposed (not contiguous) one, plain values and None:
    every leaf reads back equal, and the shared storage is still one."""
    g = torch.Generator().manual_seed(0)
    big = torch.randn(3, 1 << 19, generator=g)  # 6 MiB: a chunk and a part of one
    doc = {
        "format": 2,
        "leaves": {
            "big": big,
            "row": big[1],
            "t": torch.randn(300, 700, generator=g).t(),
            "bf16": torch.randn(1 << 20, generator=g).to(torch.bfloat16),
            "f64": torch.randn(1 << 18, generator=g, dtype=torch.float64),
            "mask": torch.rand(1 << 21, generator=g) > 0.5,
            "ids": torch.arange(10),
            "name": "torch.float32",
            "n": 3,
        },
        "fp64": None,
    }
    save(str(tmp_path / "r.pt"), doc)
    got = torch.load(tmp_path / "r.pt", weights_only=True)
    assert got.keys() == doc.keys() and got["fp64"] is None
    for k, v in doc["leaves"].items():
        w = got["leaves"][k]
        if isinstance(v, torch.Tensor):
            assert w.dtype == v.dtype and w.shape == v.shape and torch.equal(w, v), k
        else:
            assert w == v, k
    assert got["leaves"]["row"].untyped_storage().data_ptr() == (
        got["leaves"]["big"].untyped_storage().data_ptr()
    )


def test_kept_outputs_are_not_all_resident_while_the_reference_is_written(tmp_path, monkeypatch):
    """A first call's 64 MiB output kept (in a file of the scratch) and saved as the
    reference: torch.save read every page of it into the resident set at once (and they
    stayed while it was mapped); saved a chunk at a time with the file's pages handed
    back, the resident set grows by a few chunks at most, and the file holds the same
    values. Keeping it added a chunk, where a clone added all 64 MiB."""
    import tempfile

    if not on_disk(str(tmp_path)):
        pytest.skip("the temporary folder is memory (tmpfs): nothing to hand back")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    n = 16 << 20  # float32: 64 MiB
    logits = torch.randn(n, generator=torch.Generator().manual_seed(1))
    before = _rss()
    out = Outputs({"output": "dict{logits}"}, {"output['logits']": logits}).kept()
    kept = _rss() - before
    assert kept < (16 << 20), f"keeping the outputs took {kept >> 20} MiB"
    before = _rss()
    save_reference(str(tmp_path / "reference.pt"), out, None)
    grew = _rss() - before
    assert grew < (16 << 20), f"the resident set grew by {grew >> 20} MiB"
    leaves, _ = load_reference(str(tmp_path / "reference.pt"))
    assert torch.equal(leaves.leaves["output['logits']"], logits)


def test_a_kept_tensor_reads_as_it_was_and_a_small_one_is_a_clone(tmp_path, monkeypatch):
    """Keeping copies a large contiguous tensor into a file (its values the same, also
    once its pages are handed back and read again) and clones a small one and a
    non-contiguous one."""
    import tempfile

    if not on_disk(str(tmp_path)):
        pytest.skip("the temporary folder is memory (tmpfs)")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    big = torch.arange(1 << 20, dtype=torch.float32)
    out = Outputs(None, {"big": big, "small": torch.arange(10.0), "t": big.view(1024, -1).t()})
    kept = out.kept().leaves
    assert FileMaps().place(kept["big"]) is not None  # a file's
    assert FileMaps().place(kept["small"]) is None and FileMaps().place(kept["t"]) is None
    assert all(torch.equal(kept[k], v) for k, v in out.leaves.items())
    let_go(kept["big"], 0, big.numel() * 4)  # read again from the file: the same
    assert torch.equal(kept["big"], big)
    assert kept["small"].data_ptr() != out.leaves["small"].data_ptr()


def test_a_reference_saved_by_chunks_is_a_whole_zip(tmp_path):
    """Every record's CRC-32 is filled in: the file passes a zip's own test, as
    torch.save's does (skip_data leaves the data records' unset)."""
    import zipfile

    doc = {"leaves": {"a": torch.randn(1 << 19), "b": torch.arange(7)}, "fp64": None}
    save(str(tmp_path / "r.pt"), doc)
    with zipfile.ZipFile(tmp_path / "r.pt") as z:
        assert z.testzip() is None
        assert any(i.filename.endswith("data/0") for i in z.infolist())


def test_a_scratch_without_room_keeps_outputs_in_memory_and_the_save_fails_cleanly(tmp_path):
    """Where no file of the outputs' size can be written (here: the process may write
    4 MiB into any file, as on a full disk), a kept output is a clone in memory with
    the same values, and a reference too large to write fails with torch's own error
    (an exception the target reports, never a signal: its blocks are reserved before any
    is written through a mapping, where a full disk would end the worker by SIGBUS)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import resource, signal, sys, tempfile, torch
        tempfile.tempdir = sys.argv[1]
        from gatekeeper.worker.outputs import Outputs
        from gatekeeper.worker.placement import FileMaps
        from gatekeeper.worker.saving import save
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))
        big = torch.randn(2 << 20)  # 8 MiB
        kept = Outputs(None, {"x": big}).kept().leaves["x"]
        assert FileMaps().place(kept) is None and torch.equal(kept, big)
        assert kept.data_ptr() != big.data_ptr()
        try:
            save(sys.argv[1] + "/r.pt", {"leaves": {"x": big}})
        except (OSError, RuntimeError) as e:
            print("refused", type(e).__name__)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.startswith("refused"), done.stderr
