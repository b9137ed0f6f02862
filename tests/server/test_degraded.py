"""The server starts and works without a GPU, without a driver, and with a ledger it cannot read."""

from __future__ import annotations

import pytest

from jupyter_gpushare.host.gpu import open_backend


def nvml_works() -> bool:
    return open_backend("nvml").kind == "nvml"


class TestNoGpu:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "gpu_backend": "nvml", "simulated_cards": ""}

    @pytest.mark.skipif(nvml_works(), reason="this host has a GPU")
    async def test_no_driver_kernels_start_without_gpu_and_the_api_says_why(self, gpushare, jp_serverapp):
        cards = await gpushare.get("cards")
        assert cards["backend"] == "none" and cards["cards"] == [] and cards["simulated"] is False
        assert "NVML could not start" in cards["reason"]
        kid = await gpushare.start_kernel()
        rec = await gpushare.kernel(kid)
        assert rec["state"] == "cpu" and rec["reason"].startswith("No GPU: NVML could not start")
        said = [e for e in (await gpushare.get("events"))["events"] if e["kind"] == "no-gpu"]
        assert [e["code"] for e in said] == ["no-gpu-none"]


class TestAutoWithoutGpu:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "gpu_backend": "auto", "simulated_cards": "2x8GiB"}

    @pytest.mark.skipif(nvml_works(), reason="this host has a GPU")
    async def test_auto_falls_back_to_clearly_labelled_simulated_cards(self, gpushare):
        cards = await gpushare.get("cards")
        assert cards["backend"] == "simulated" and cards["simulated"] is True
        assert [c["name"] for c in cards["cards"]] == ["Simulated GPU (no real memory)"] * 2
        assert "NVML could not start" in cards["reason"]


class TestCorruptLedger:
    @pytest.fixture
    def corrupt(self, ledger_file):
        import os

        os.makedirs(os.path.dirname(ledger_file), exist_ok=True)
        with open(ledger_file, "wb") as f:
            f.write(b"garbage, not SQLite" * 200)
        return ledger_file

    async def test_server_runs_kernels_start_without_gpu_and_the_file_is_kept(self, corrupt, gpushare):
        cards = await gpushare.get("cards")
        assert corrupt in cards["ledger"]["error"] and "left as it is" in cards["ledger"]["error"]
        assert cards["cards"][0]["reserved_mib"] == 0
        kid = await gpushare.start_kernel()
        rec = await gpushare.kernel(kid)
        assert rec["state"] == "cpu" and corrupt in rec["reason"]
        with open(corrupt, "rb") as f:
            assert f.read() == b"garbage, not SQLite" * 200


def test_simulated_card_list_errors():
    from jupyter_gpushare.core.policy import PolicyError
    from jupyter_gpushare.host.gpu import parse_simulated_cards

    assert parse_simulated_cards("2x16GiB,8GiB") == [16384, 16384, 8192]
    for bad, hint in (("0x8GiB", "not a card list"), ("512MiB", "smaller than 1 GiB"), (",", "names no card")):
        with pytest.raises(PolicyError, match=hint):
            parse_simulated_cards(bad)
