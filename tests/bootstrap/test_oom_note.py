"""The out-of-memory note says what the notebook needed on earlier runs, when the server knows it.

The provisioner sets GPUSHARE_PEAK_BEFORE_MIB (NVML's peak of the notebook's earlier runs, CUDA context
included) in a kernel whose notebook has history; the note then carries one sentence with it. The
value comes through the environment, which the notebook can change: anything but a plain positive
whole number below 2**40 is ignored.
"""

from __future__ import annotations

import pytest
from test_bootstrap import CARD, boot_module, gpu_env, run_py

SENTENCE = "On earlier runs this notebook needed up to"


@pytest.fixture
def oom(monkeypatch):
    for name, value in {
        "GPUSHARE_MODE": "gpu",
        "GPUSHARE_QUOTA_MIB": "4096",
        "GPUSHARE_CARD_NAME": "NVIDIA H100",
    }.items():
        monkeypatch.setenv(name, value)
    return boot_module("_gpushare_oom")


@pytest.mark.parametrize(("value", "said"), [("2150", "2.1 GiB"), ("700", "700 MiB"), ("1024", "1 GiB")])
def test_the_note_says_what_earlier_runs_needed(oom, monkeypatch, value, said):
    monkeypatch.setenv("GPUSHARE_PEAK_BEFORE_MIB", value)
    note = oom.oom_note("torch").splitlines()
    assert f"{SENTENCE} {said} of GPU memory (CUDA context included)." in note
    assert note[-1].startswith("What to do:")  # the advice stays last


@pytest.mark.parametrize(
    "value", ["", "0", "-5", "+5", " 12", "12 ", "1_000", "12.5", "1e3", "007", "٣", "abc", str(2**40), "9" * 30]
)
def test_a_value_that_is_not_a_plain_size_is_ignored(oom, monkeypatch, value):
    monkeypatch.setenv("GPUSHARE_PEAK_BEFORE_MIB", value)
    assert SENTENCE not in oom.oom_note("jax")


def test_without_history_the_note_is_as_before(oom, monkeypatch):
    monkeypatch.delenv("GPUSHARE_PEAK_BEFORE_MIB", raising=False)
    assert SENTENCE not in oom.oom_note("cupy")


def test_a_real_out_of_memory_error_gets_the_sentence(tmp_path):
    """A real JAX RESOURCE_EXHAUSTED at the top of a script (a kernel's child process, as !python train.py):
    the traceback, then the note with the quota and what earlier runs needed."""
    env = gpu_env(tmp_path, GPUSHARE_PEAK_BEFORE_MIB="2150")
    out = run_py("import jax.numpy as jnp\njnp.zeros((2**44,), dtype=jnp.uint8).block_until_ready()", env)
    assert out.returncode == 1
    trace, _, note = out.stderr.partition("[jupyter-gpushare] JAX ran out of memory.")
    assert "RESOURCE_EXHAUSTED" in trace
    assert f"quota is 2 GiB on {CARD.name}" in note
    assert f"{SENTENCE} 2.1 GiB of GPU memory (CUDA context included)." in note
