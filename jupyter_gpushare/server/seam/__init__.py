"""The seam with Jupyter: every use of jupyter_server's and jupyter_client's internals is here, and nowhere else.

- ``internals.py``: each private name we rely on, behind a function that says why (none has a public hook);
  ``tests/server/test_jupyter_internals.py`` pins each, so a release without one fails CI loudly.
- ``connection.py``: the kernel websocket of a kernel that waits for a GPU (a subclass of jupyter_server's).
- ``refusals.py``: the routes that start kernels (``POST /api/kernels`` and ``/api/sessions``), replaced so that a
  refused start answers its own status, code and figures.
"""
