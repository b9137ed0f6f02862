"""Where settings come from: the files a Jupyter server of this user reads, and the settings a running server
publishes for this user's `jupyter gpushare status` and `doctor` (and a program that starts kernels outside a
server) to read. Reading and writing only; what a setting means and allows is settings.py's."""

from __future__ import annotations

import os

from traitlets.config import Config

from .settings import GpuShareApp

CONFIG_FILES = ("jupyter_config", "jupyter_server_config")  # what a Jupyter server reads, lowest priority first


def load_config(
    extra: str | None = None, over: Config | None = None, running: bool = False
) -> tuple[Config, list[str]]:
    """The config a Jupyter server of this user reads (``jupyter_config`` and ``jupyter_server_config``, .json
    then .py, in every directory of the Jupyter config path, lowest priority first); with ``running``, then
    the settings this user's running server uses (its command line included, ``publish``); then ``extra``
    (a file), then ``over`` (e.g. a command line's). Returns the config and where it came from, in order."""
    from jupyter_core.paths import jupyter_config_path
    from traitlets.config.loader import JSONFileConfigLoader, PyFileConfigLoader

    config, read = Config(), []

    def load(directory: str, name: str) -> None:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            loader = PyFileConfigLoader if name.endswith(".py") else JSONFileConfigLoader
            config.merge(loader(name, path=directory).load_config())
            read.append(path)

    for directory in reversed(jupyter_config_path()):
        for base in CONFIG_FILES:
            for ext in (".json", ".py"):
                load(directory, base + ext)
    server = running_server() if running else None
    if server is not None:
        config.merge(Config({"GpuShareApp": server["settings"]}))
        read.append(f"the running Jupyter server (pid {server['pid']})")
    if extra:
        load(*os.path.split(os.path.abspath(extra)))
    if over is not None:
        config.merge(over)
    return config, read


def _published_dir() -> str:
    from jupyter_core.paths import jupyter_runtime_dir

    return os.path.join(jupyter_runtime_dir(), "gpushare")


def publish(settings: GpuShareApp) -> str:
    """Write the settings a server runs with (command line included) where this user's `jupyter gpushare status`
    and `doctor` find them; returns the file, which the server removes when it stops."""
    import json

    from ..host.procs import ProcessRef

    me = ProcessRef.me()
    values = {name: getattr(settings, name) for name in settings.trait_names(config=True)}
    path = os.path.join(_published_dir(), f"settings-{me.pid}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"pid": me.pid, "start": me.start, "settings": values}, f)
    os.replace(path + ".tmp", path)
    return path


def running_server() -> dict | None:
    """The settings of this user's newest running server (``publish``), or None."""
    import glob
    import json

    from ..host.procs import ProcessRef

    found = []
    for path in glob.glob(os.path.join(_published_dir(), "settings-*.json")):
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if ProcessRef(data["pid"], data["start"]).alive() and isinstance(data.get("settings"), dict):
                found.append((os.path.getmtime(path), data))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return max(found, key=lambda x: x[0])[1] if found else None
