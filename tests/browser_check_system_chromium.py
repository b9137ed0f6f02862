"""`python -m jupyterlab.browser_check`, with Debian's Chromium instead of a downloaded browser.

JupyterLab's browser check starts the app, loads it in a headless browser with its own
browser-test.js, and fails on any JS console error, page error or Python logged error. Its
run_browser always runs `npx playwright install chromium`, a browser download this project never
does; this runs the same BrowserApp and the same browser-test.js, resolving `require('playwright')`
to a shim over the playwright-core that labextension/ui-tests installs, launching /usr/bin/chromium.

    python tests/browser_check_system_chromium.py --allow-root [--GpuShareApp.x=y ...]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import jupyterlab.browser_check as browser_check

ROOT = Path(__file__).resolve().parent.parent
PLAYWRIGHT_CORE = ROOT / "labextension" / "ui-tests" / "node_modules" / "playwright-core"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

SHIM = """
const core = require(%(core)s);
const args = ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync'];
module.exports = {
  ...core,
  chromium: { launch: (options) => core.chromium.launch({ ...options, executablePath: %(chromium)s, args }) },
};
"""


async def run_browser(url: str) -> None:
    target = Path(tempfile.mkdtemp(prefix="browser-check-"))
    shim = target / "node_modules" / "playwright"
    shim.mkdir(parents=True)
    (shim / "index.js").write_text(SHIM % {"core": repr(str(PLAYWRIGHT_CORE)), "chromium": repr(CHROMIUM)})
    shutil.copy(Path(browser_check.__file__).parent / "browser-test.js", target / "browser-test.js")
    try:
        await browser_check.run_async_process(["node", "browser-test.js", url], cwd=target)
    finally:
        shutil.rmtree(target, ignore_errors=True)


class SystemChromiumBrowserApp(browser_check.BrowserApp):
    """BrowserApp whose browser step is run_browser above; everything else is JupyterLab's."""

    def initialize_handlers(self) -> None:
        if self.test_browser:
            browser_check.run_test(self.serverapp, run_browser)
        super(browser_check.BrowserApp, self).initialize_handlers()


def _jupyter_server_extension_points():
    # The app is found through the module that defines it (here __main__), as upstream's `-m` run does.
    return [{"module": __name__, "app": SystemChromiumBrowserApp}]


if __name__ == "__main__":
    SystemChromiumBrowserApp.launch_instance(argv=sys.argv[1:])
