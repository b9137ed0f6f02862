"""jupyter-gpushare kernel bootstrap, found through the PYTHONPATH the provisioner gives a kernel.

Standard library only: the kernel's environment may not have jupyter-gpushare installed. It
installs the framework hooks (see ``_gpushare_boot``), then runs the ``sitecustomize`` this file
shadows, if there is one, so the environment's own start-up code still runs.
"""

import os
import sys


def _gpushare_start():
    try:
        import _gpushare_boot

        _gpushare_boot.install()
    except Exception as e:  # never stop the interpreter from starting
        sys.stderr.write(f"jupyter-gpushare: the kernel bootstrap failed, no GPU caps apply: {e!r}\n")


def _gpushare_chain():
    """Import the ``sitecustomize`` that this one shadows (the next one on sys.path), if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.get("sitecustomize")
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  (the shadowed one)
    except ImportError as e:
        if e.name != "sitecustomize":
            sys.stderr.write(f"Error in the shadowed sitecustomize: {e!r}\n")
    except Exception as e:  # report as site.py would, and go on starting
        sys.stderr.write(f"Error in the shadowed sitecustomize: {e!r}\n")
    finally:
        if "sitecustomize" not in sys.modules and ours is not None:
            sys.modules["sitecustomize"] = ours
        # Put our directory back where it was, keeping whatever the shadowed module added.
        for i, p in enumerate(saved):
            if os.path.abspath(p or os.curdir) == here and p not in sys.path:
                sys.path.insert(min(i, len(sys.path)), p)


_gpushare_start()
_gpushare_chain()
