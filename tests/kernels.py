"""Running code in a real kernel of the in-process test server (pytest-jupyter's ``jp_serverapp``)."""

from __future__ import annotations


async def run_in_kernel(jp_serverapp, kernel_id: str, code: str) -> str:
    """Run code in a real kernel; its printed output."""
    client = jp_serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    out: list = []
    try:
        await client.wait_for_ready(timeout=60)
        reply = await client.execute_interactive(code, output_hook=out.append, timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
    return "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream")
