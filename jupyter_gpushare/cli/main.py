"""`jupyter gpushare <command>`: status, doctor, options, broker, k8s-profiles.

A JupyterApp with subcommands. ``status`` and ``doctor`` read the settings a Jupyter server of this user
reads, the same files the same way (``sources.load_config``), then the settings this user's running server
uses (its command line included), then ``--config FILE`` and their own command line (``--GpuShareApp.x=y``),
and say where each came from; ``options`` lists every setting with its value here and its default. Imports stay
light so that ``status`` answers fast.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

from jupyter_core.application import JupyterApp
from traitlets import Bool, Enum, Int, List, TraitError, Unicode, default

from ..core.policy import PolicyError

__all__ = ["DoctorCommand", "GpuShareCommand", "K8sProfilesCommand", "OptionsCommand", "StatusCommand", "main"]


def _print(text: str) -> None:
    """Print, and end quietly when the reader has gone (`jupyter gpushare status --json | head`)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit


class _ReadsSettings(JupyterApp):
    """A subcommand that reads the settings a Jupyter server of this user reads (see the module's doc)."""

    sources: list[str]

    def initialize(self, argv: list[str] | None = None) -> None:
        # What the commands find they print once, themselves: the package's own log (a broker that does not
        # answer, say) would say it a second time.
        own = logging.getLogger("jupyter_gpushare")
        own.propagate = False
        own.addHandler(logging.NullHandler())
        super().initialize(argv)

    @default("log_level")
    def _default_log_level(self) -> int:
        return 40  # errors only: what it finds is printed, once

    def load_config_file(self, suppress_errors: bool = True) -> None:  # type: ignore[override]
        from ..config.sources import load_config

        config, self.sources = load_config(self.config_file or None, running=True)
        self.update_config(config)


class StatusCommand(_ReadsSettings):
    name = "jupyter-gpushare-status"
    description = "Cards, users, kernels, quotas, GPU memory in use and the queue, as this user may see them."

    json = Bool(False, config=True, help="Print JSON instead of tables.")
    socket = Unicode(
        "",
        config=True,
        help="Ask this broker (a Unix socket, tcp:// or tls://). Default: GpuShareApp.broker_socket, or the "
        "host's broker if one runs.",
    )
    ledger = Unicode("", config=True, help="Read this ledger file instead (default: GpuShareApp.ledger_path).")
    flags = {"json": ({"StatusCommand": {"json": True}}, "Print JSON instead of tables.")}
    aliases = {"socket": "StatusCommand.socket", "ledger": "StatusCommand.ledger", "config": "JupyterApp.config_file"}

    def start(self) -> None:
        from ..config.settings import settings_from
        from ..ledger.ledger import LedgerError
        from .status import format_status, gather_status

        try:
            view = gather_status(settings_from(self.config), self.socket or None, self.ledger or None)
        except (LedgerError, PolicyError) as e:
            print(f"jupyter gpushare status: {e}", file=sys.stderr)
            self.exit(2)
        view["settings_from"] = self.sources
        _print(json.dumps(view, indent=2) if self.json else format_status(view))


class DoctorCommand(_ReadsSettings):
    name = "jupyter-gpushare-doctor"
    description = "Check driver, cards, settings, ledger, broker and enforcement tiers; each finding says what to do."

    json = Bool(False, config=True, help="Print JSON instead of lines.")
    socket = Unicode("", config=True, help="Check this broker (default: GpuShareApp.broker_socket).")
    flags = {"json": ({"DoctorCommand": {"json": True}}, "Print JSON instead of lines.")}
    aliases = {"socket": "DoctorCommand.socket", "config": "JupyterApp.config_file"}

    def start(self) -> None:
        from .doctor import diagnose, render

        findings = diagnose(self.config, self.socket or None, self.sources)
        _print(json.dumps([f.to_dict() for f in findings], indent=2) if self.json else render(findings))
        self.exit(1 if any(f.status == "error" for f in findings) else 0)


class OptionsCommand(_ReadsSettings):
    name = "jupyter-gpushare-options"
    description = (
        "Every GpuShareApp option (and the broker's, with --broker): its value here, its default, what it does."
    )

    broker = Bool(False, config=True, help="Also list the broker's own options (GpuShareBroker).")
    flags = {"broker": ({"OptionsCommand": {"broker": True}}, "Also list the broker's own options (GpuShareBroker).")}
    aliases = {"config": "JupyterApp.config_file"}

    def start(self) -> None:
        from ..config.settings import GpuShareApp

        classes: list[type] = [GpuShareApp]
        if self.broker:
            from ..broker.server import GpuShareBroker

            classes.append(GpuShareBroker)
        lines = [f"Settings read from: {', '.join(self.sources) or 'no config file (the defaults)'}", ""]
        try:
            for cls in classes:
                lines += _options(cls(config=self.config), self.config.get(cls.__name__, {}))
        except TraitError as e:  # a value its option refuses: said as `status` and `doctor` say it
            print(f"jupyter gpushare options: {e}", file=sys.stderr)
            self.exit(2)
        _print("\n".join(lines).rstrip("\n"))


def _options(configured: Any, set_here: Any) -> list[str]:
    """The configurable options of ``configured`` (an object made with the settings read here), each with its value
    where one is set (the files, a running server, the command line), its default and its help, wrapped to 100
    columns."""
    import textwrap

    lines = []
    for name, trait in sorted(configured.traits(config=True).items()):
        default = trait.default_value_repr()
        value = f"{getattr(configured, name)!r} (set; default {default})" if name in set_here else default
        lines.append(f"{type(configured).__name__}.{name} = {value}")
        lines += textwrap.wrap(trait.help or "", 100, initial_indent="    ", subsequent_indent="    ")
        lines.append("")
    return lines


class K8sProfilesCommand(JupyterApp):
    name = "jupyter-gpushare-k8s-profiles"
    description = "Zero-to-JupyterHub singleuser values: one profile per GPU kind (docs/kubernetes.md)."

    whole_gpu = Bool(False, config=True, help="A profile with one whole GPU.")
    mig = List(Unicode(), config=True, help="A MIG profile, e.g. 1g.10gb (repeat --mig for more).")
    hami_gpumem = List(Int(), config=True, help="A HAMi slice of this many MiB (repeat for more).")
    hami_gpucores = Int(None, allow_none=True, config=True, help="SM share of HAMi slices, in percent.")
    no_cpu = Bool(False, config=True, help="No CPU-only profile.")
    default_quota = Unicode("25%", config=True, help="Each kernel's share of the pod's slice. Default: 25%.")
    card_headroom = Unicode("256MiB", config=True, help="Kept free in the slice. Default: 256MiB.")
    whole_gpu_product = Unicode("", config=True, help="Pin whole-GPU pods to nodes of this nvidia.com/gpu.product.")
    mig_product = Unicode("", config=True, help="Pin MIG pods to nodes of this GPU (checks its MIG profiles).")
    hami_scheduler = Unicode("hami-scheduler", config=True, help="HAMi's scheduler name. Default: hami-scheduler.")
    format = Enum(["yaml", "json"], "yaml", config=True, help="Output format. Default: yaml.")
    flags = {
        "whole-gpu": ({"K8sProfilesCommand": {"whole_gpu": True}}, "A profile with one whole GPU."),
        "no-cpu": ({"K8sProfilesCommand": {"no_cpu": True}}, "No CPU-only profile."),
    }
    aliases = {
        name.replace("_", "-"): f"K8sProfilesCommand.{name}"
        for name in ("mig", "hami_gpumem", "hami_gpucores", "default_quota", "card_headroom", "whole_gpu_product",
                     "mig_product", "hami_scheduler", "format")
    }  # fmt: skip

    def start(self) -> None:
        from .k8s import dump, z2jh_values

        try:
            values = z2jh_values(
                whole_gpu=self.whole_gpu, mig=self.mig, hami_gpumem=self.hami_gpumem, hami_gpucores=self.hami_gpucores,
                cpu_profile=not self.no_cpu, default_quota=self.default_quota, card_headroom=self.card_headroom,
                whole_gpu_product=self.whole_gpu_product or None, mig_product=self.mig_product or None,
                hami_scheduler=self.hami_scheduler,
            )  # fmt: skip
        except PolicyError as e:
            print(f"jupyter gpushare k8s-profiles: {e}", file=sys.stderr)
            self.exit(2)
        _print(dump(values, self.format).rstrip("\n"))


class GpuShareCommand(JupyterApp):
    name = "jupyter-gpushare"
    description = "GPU memory quotas for Jupyter kernels: tools for admins and students."
    subcommands = {
        "status": ("jupyter_gpushare.cli.main.StatusCommand", StatusCommand.description),
        "doctor": ("jupyter_gpushare.cli.main.DoctorCommand", DoctorCommand.description),
        "options": ("jupyter_gpushare.cli.main.OptionsCommand", OptionsCommand.description),
        "broker": ("jupyter_gpushare.broker.server.GpuShareBroker", "Run the host-wide broker (docs/multi-user.md)."),
        "k8s-profiles": ("jupyter_gpushare.cli.main.K8sProfilesCommand", K8sProfilesCommand.description),
    }

    def start(self) -> None:
        if self.subapp is None:
            print(f"{self.description}\nCommands: {', '.join(self.subcommands)} (jupyter gpushare <command> --help)")
            self.exit(2)
            return
        self.subapp.start()


def main(argv: list[str] | None = None) -> int:
    GpuShareCommand.launch_instance(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
