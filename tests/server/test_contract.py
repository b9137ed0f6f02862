"""The contract between the server and the sidebar, checked on both sides' source.

- The catalogue of words: ``labextension/src/words.ts`` words every code the server sends through JupyterLab's
  translator; its English must be ``jupyter_gpushare/core/words.py``'s, code for code, so that the server's logs and
  CLI, and the sidebar in English, say the same.
- Figures: sizes and times are said by the same rules on both sides (``labextension/test/format-cases.json``,
  which the node tests read too).
- Types: ``labextension/src/types.ts`` follows ``api/openapi.yaml``: every field the sidebar reads exists in the
  schema, a field the sidebar needs is one the server always sends, and every closed set of values (states,
  codes, severities) is the same set.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import jupyter_gpushare
from jupyter_gpushare.core.policy import CardView, Policy, PolicyError, Size, format_mib, parse_size
from jupyter_gpushare.core.words import CATALOGUE, PLURALS, SEVERITY, format_duration, render

ROOT = Path(__file__).resolve().parent.parent.parent
SRC = ROOT / "labextension" / "src"
SPEC = yaml.safe_load((Path(jupyter_gpushare.__file__).parent / "server" / "api" / "openapi.yaml").read_text())


def ts_catalogue(function: str = "catalogue") -> dict[str, str]:
    """The entries of one of words.ts's catalogue functions (``catalogue``: the server's codes; ``uiCatalogue``:
    the sidebar's own words)."""
    text = (SRC / "words.ts").read_text()
    body = text[text.index(f"function {function}(") :]
    body = body[: body.index("\n}\n")]
    entries = re.findall(r"'([a-z_.\-]+)':\s*__\(\s*'((?:[^'\\]|\\.)*)'\s*\)", body)
    return {code: template.replace("\\'", "'") for code, template in entries}


def test_every_code_the_sidebar_says_is_in_its_catalogue():
    """A typo in a code would show the code itself on screen: every literal code said in the sources exists."""
    known = ts_catalogue() | ts_catalogue("uiCatalogue")
    said = {code for path in SRC.glob("*.ts") for code in re.findall(r"\bsay\(\s*'([^']+)'", path.read_text())}
    assert said and not said - known.keys(), sorted(said - known.keys())
    assert all(code.startswith("ui.") for code in ts_catalogue("uiCatalogue"))


def test_the_sidebar_words_every_code_as_the_server_does():
    ts = ts_catalogue()
    assert ts, "no entries found in words.ts"
    missing, extra = CATALOGUE.keys() - ts.keys(), ts.keys() - CATALOGUE.keys()
    assert not missing and not extra, f"words.ts lacks {sorted(missing)}, has more: {sorted(extra)}"
    differ = {code: (CATALOGUE[code], ts[code]) for code in CATALOGUE if CATALOGUE[code] != ts[code]}
    assert not differ, differ


def test_every_state_and_event_with_a_notification_has_words():
    status = SPEC["components"]["schemas"]["Status"]["properties"]["code"]["enum"]
    for code in status:
        assert f"status.{code}.label" in CATALOGUE and f"status.{code}.detail" in CATALOGUE, code
    # an optional part is left out when its figure is unknown; a missing figure elsewhere shows as a dash
    assert render("status.queued.detail", {"position": 1, "need_mib": 4710}).startswith(
        "Waiting for a GPU: #1 in line, needs 4.6 GiB. CPU cells run now"
    )
    assert render("status.running.detail", {}).startswith("Uses – of its – reservation")
    assert render("event.not-a-code", {"message": "As said."}) == "As said."
    # a figure's own text is said as it is, never read as a template (what a kernel reports is the student's)
    said = render("status.cpu.detail", {"reason": "{reason} [{position}]"})
    assert said == "Started without a GPU. {reason} [{position}]"


def test_figures_are_said_by_one_rule_on_both_sides():
    cases = json.loads((ROOT / "labextension" / "test" / "format-cases.json").read_text())
    assert [format_mib(mib) for mib, _ in cases["sizes"]] == [text for _, text in cases["sizes"]]
    assert [format_duration(s) for s, _ in cases["durations"]] == [text for _, text in cases["durations"]]
    assert [render(code, params) for code, params, _ in cases["sentences"]] == [t for *_, t in cases["sentences"]]


def test_every_coded_event_is_short_enough_to_be_read_whole_in_a_notification():
    """JupyterLab cuts a notification at 140 characters: an event's words, with the largest figures, leave room
    for the notebook's name before them. (``event.refused`` says a policy's own English: not bounded here.)"""
    big = {"_mib": 143771, "_s": 7500, "_pct": 100, "": 40}

    def largest(name: str) -> int:
        return next(value for suffix, value in big.items() if name.endswith(suffix))

    for code, template in CATALOGUE.items():
        names = re.findall(r"\{([a-z_]+)\}", template)
        if not code.startswith("event.") or {"message", "reason", "framework"} & set(names):
            continue
        said = render(code, {name: largest(name) for name in names})
        assert len(said) <= 120, (code, len(said), said)  # a name of up to 18 characters fits before it
    assert len(render("event.out-of-memory", {"framework": "tensorflow", "quota_mib": 143771,
                                              "retry_mib": 143771})) <= 120  # fmt: skip


def test_plurals_are_chosen_by_the_same_count_on_both_sides():
    text = (SRC / "words.ts").read_text()
    block = text[text.index("export const PLURALS") :]
    block = block[: block.index("};")]
    ts = dict(re.findall(r"'([a-z_.\-]+)':\s*'([a-z_]+)'", block))
    assert {code: count for code, count in ts.items() if not code.startswith("ui.")} == PLURALS
    words = CATALOGUE | ts_catalogue("uiCatalogue")  # (the sidebar's own codes count in its words only)
    for code, count in ts.items():
        assert f"{code}.one" in words and f"{{{count}}}" in words[code] and f"{{{count}}}" in words[f"{code}.one"]


# -- types.ts against openapi.yaml ---------------------------------------------------------------------------


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def ts_declarations() -> tuple[dict[str, dict[str, tuple[bool, str]]], dict[str, str]]:
    """The interfaces of types.ts (name -> field -> (optional, type)) and its type aliases."""
    text = _strip_comments((SRC / "types.ts").read_text())
    aliases = {m.group(1): m.group(2) for m in re.finditer(r"export type (\w+)\s*=\s*([^;]+);", text)}
    interfaces: dict[str, dict[str, tuple[bool, str]]] = {}
    for m in re.finditer(r"export interface (\w+)(?: extends (\w+))?\s*\{", text):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        fields = dict(interfaces.get(m.group(2), {})) if m.group(2) else {}
        body, depth, start = text[m.end() : i - 1], 0, 0
        for j, ch in enumerate(body + ";"):
            depth += {"{": 1, "(": 1, "[": 1, "}": -1, ")": -1, "]": -1}.get(ch, 0)
            if ch == ";" and depth == 0:
                member, start = body[start:j].strip(), j + 1
                field = re.match(r"(\w+)(\?)?\s*:\s*(.+)", member, re.S)
                if field:
                    fields[field.group(1)] = (bool(field.group(2)), " ".join(field.group(3).split()))
        interfaces[m.group(1)] = fields
    return interfaces, aliases


def _resolve(schema: dict) -> dict:
    while "$ref" in schema:
        schema = SPEC["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def schema_fields(schema: dict) -> tuple[dict[str, dict], set[str]]:
    """The properties of a schema, allOf flattened, and which are required."""
    schema = _resolve(schema)
    props, required = dict(schema.get("properties", {})), set(schema.get("required", []))
    for part in schema.get("allOf", []):
        p, r = schema_fields(part)
        props.update(p)
        required |= r
    return props, required


def _schema(path: str) -> dict:
    """A schema by a path of names: 'State.kernels[]' is the items of State's kernels."""
    name, *rest = path.split(".")
    schema = SPEC["components"]["schemas"][name]
    for part in rest:
        items = part.endswith("[]")
        props, _ = schema_fields(schema)
        schema = props[part.removesuffix("[]")]
        if items:
            schema = schema["items"]
    return schema


def _host_limits_use() -> dict:
    reply = SPEC["paths"]["/host"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    return reply["properties"]["limits_use"]


PAIRS = {  # types.ts interface -> its schema
    "ICardRef": lambda: _schema("CardRef"),
    "ICard": lambda: _schema("State.cards[]"),
    "IFramework": lambda: _schema("Framework"),
    "IKernel": lambda: _schema("State.kernels[]"),
    "IHeld": lambda: _schema("Enforcement"),
    "IOom": lambda: _schema("Kernel.oom"),
    "IQueueEntry": lambda: _schema("QueueEntry"),
    "IEvent": lambda: _schema("Event"),
    "ISegment": lambda: _schema("Segment"),
    "IStatus": lambda: _schema("Status"),
    "IState": lambda: _schema("State"),
    "IConfig": lambda: _schema("Config"),
    "ISize": lambda: _schema("Size"),
    "ILimitsUse": _host_limits_use,
}


def _literals(ts_type: str, aliases: dict[str, str]) -> set[str] | None:
    """The string literals of a union type (an alias resolved), or None when it is not a closed set."""
    parts = [p.strip() for p in ts_type.split("|") if p.strip()]
    parts = [q.strip() for p in parts for q in aliases.get(p, p).split("|") if q.strip()]
    literals = {p[1:-1] for p in parts if p.startswith("'") and p.endswith("'")}
    others = [p for p in parts if not (p.startswith("'") and p.endswith("'")) and p not in ("null", "undefined")]
    return literals if literals and not others else None


@pytest.mark.parametrize("interface", sorted(PAIRS))
def test_types_ts_follows_the_openapi_schema(interface):
    interfaces, aliases = ts_declarations()
    assert interface in interfaces, f"types.ts has no interface {interface}"
    props, required = schema_fields(PAIRS[interface]())
    fields = interfaces[interface]
    invented = set(fields) - set(props)
    assert not invented, f"{interface} reads fields the API does not have: {sorted(invented)}"
    trusted = {name for name, (optional, _) in fields.items() if not optional} - required
    assert not trusted, f"{interface} needs fields the API may leave out: {sorted(trusted)}"
    for name, (_, ts_type) in fields.items():
        enum = _resolve(props[name]).get("enum")
        literals = _literals(ts_type, aliases)
        if enum is not None or literals is not None:
            assert literals == {e for e in enum or [] if e is not None}, (
                f"{interface}.{name}: types.ts says {sorted(literals or [])}, the API {enum}"
            )


def test_the_kernel_environment_is_named_in_one_place():
    """``GPUSHARE_*`` names are written once, in ``bootstrap/_gpushare_env.py``: the server's ``kernel_env.py``
    and the bootstrap's modules use its constants, so a renamed variable cannot leave one side behind."""
    package = Path(jupyter_gpushare.__file__).parent
    literal = re.compile(r"""(["'])GPUSHARE_[A-Z_]+\1""")
    for path in [package / "launch" / "kernel_env.py", *sorted((package / "bootstrap").glob("*.py"))]:
        if path.name == "_gpushare_env.py":
            continue
        code = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in code if literal.search(line)], path.name


@pytest.mark.parametrize(
    "quota, policy, code",
    [
        ("128MiB", Policy(min_quota=Size(mib=256)), "quota-below-min"),
        ("7GiB", Policy(max_quota=Size(mib=6144)), "quota-above-max"),
        ("90%", Policy(max_quota=None, headroom=Size(mib=1024)), "quota-unfit"),
    ],
)
def test_a_rules_refusal_says_the_same_in_the_server_s_english_and_the_sidebar_s(quota, policy, code):
    with pytest.raises(PolicyError) as refused:
        policy.check_quota(parse_size(quota), [CardView("GPU-0", 0, 8192)])
    error = refused.value
    assert error.code == code and render(f"policy.{code}", error.params) == str(error)
    assert f"event.refused-{error.code}" in CATALOGUE  # and a short form for a kernel that did not start


def test_every_event_code_the_server_gives_has_words():
    """Each code passed to an event (``code="..."``, a no-gpu reason, a failed action) and each announced kind
    that has no code of its own is in the catalogue: none reaches a notification as the server's English."""
    source = "\n".join(p.read_text() for p in (ROOT / "jupyter_gpushare").rglob("*.py"))
    codes = set(re.findall(r'code="([a-z-]+)"', source)) | set(re.findall(r'"(no-gpu-[a-z]+)"', source))
    codes |= {f"action-failed-{action}" for action in ("interrupt", "restart", "shutdown")}
    assert {"refused-no-room", "refused-timeout", "no-gpu-full", "no-gpu-none", "no-gpu-ledger"} <= codes
    assert sorted(code for code in codes if f"event.{code}" not in CATALOGUE) == []
    always_coded = {"no-gpu", "action-failed"}  # (their events always carry one of the codes above)
    assert sorted(k for k in SEVERITY if f"event.{k}" not in CATALOGUE and k not in always_coded) == []


def test_the_kernel_states_are_written_once_and_every_place_follows():
    """life.STATES (a record's states) and life.JUDGED (the policies' judgment of a running kernel) are the one list:
    the API's enum, the catalogue's status words (and so words.ts's), the sidebar's KernelState union and the type
    checker's Literals follow it, no more and no less; a state that is not in it is refused, never shown as
    'failed'."""
    from typing import get_args

    from jupyter_gpushare.server.enforce import Judgment
    from jupyter_gpushare.server.life import JUDGED, MOVES, STATES, KernelState
    from jupyter_gpushare.server.state import kernel_status

    every = set(STATES) | set(JUDGED)
    props, _ = schema_fields(SPEC["components"]["schemas"]["Kernel"])
    assert set(_resolve(props["state"])["enum"]) == every
    assert set(get_args(KernelState)) == set(STATES) and set(get_args(Judgment)) == set(JUDGED)
    assert set(MOVES) == set(STATES) and all(set(to) <= set(STATES) for to in MOVES.values())
    life = (ROOT / "docs" / "architecture.md").read_text().split("## A kernel's life", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{state}`" in life for state in STATES)  # the drawing names every state
    _, aliases = ts_declarations()
    assert set(re.findall(r"'(\w+)'", aliases["KernelState"])) == every
    for state in every:
        assert f"status.{state}.label" in CATALOGUE and f"status.{state}.detail" in CATALOGUE, state
    with pytest.raises(ValueError, match="'sleeping' is not a kernel state"):
        kernel_status({"state": "sleeping"})
