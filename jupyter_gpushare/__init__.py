"""jupyter-gpushare: per-kernel GPU memory quotas for shared GPU servers."""

__version__ = "0.1.0"


def _jupyter_server_extension_points():
    from .server.app import GpuShareExtension

    return [{"module": "jupyter_gpushare", "app": GpuShareExtension}]


def _jupyter_labextension_paths():
    return [{"src": "labextension", "dest": "jupyter-gpushare"}]
