"""The store scripts' arguments and reply codes by name (store/wire.py): the Python packers put
each value where the table says, the Lua scripts read ARGV only through the table's names, and
they write a status code only through the names generated from its Python definition."""

from __future__ import annotations

import re
from importlib import resources

import redis

from celery_fair.core.lanes import EMPTY_SWEEPS, GRACE
from celery_fair.store.base import Ask, Done, Running, Verdict
from celery_fair.store.redis import _SCRIPTS, _STANDALONE, RedisStore, _source
from celery_fair.store.wire import (
    ASK,
    FINISH_APPLIED,
    FINISH_STALE,
    FINISHED,
    HEAD,
    LANE_OPS,
    LANE_VERSION_TICKS_PER_S,
    RENEW_EVERY,
    RUNNING,
    SWEEP,
    TOKEN_LOW_BITS,
    TOKEN_TICKS_PER_S,
    first_lane_version,
    first_token,
    lease_held_for,
    lua_constants,
    pack_token,
    unpack_token,
)

SCRIPTS = sorted(_SCRIPTS)


def code(name: str) -> str:
    """A script's text without its comments."""
    text = (resources.files("celery_fair.store") / "lua" / f"{name}.lua").read_text()
    return "\n".join(line.split("--")[0] for line in text.splitlines())


def test_every_lua_file_is_a_scheduling_script_or_a_standalone_one():
    files = {
        p.name[: -len(".lua")]
        for p in (resources.files("celery_fair.store") / "lua").iterdir()
        if p.name.endswith(".lua")
    }
    assert files == {"common", *_SCRIPTS, *_STANDALONE}
    assert not set(_SCRIPTS) & set(_STANDALONE)


def store() -> RedisStore:
    # Never connected: building a request is pure.
    return RedisStore(redis.Redis(host="127.0.0.1", port=1), prefix="wire", lease=12.5)


ASKED = Ask(
    "u1", "clone", 8, 3, None, "git:linux", "clone:linux", "tenant", 2.5, 1.0, 4, 0.5, 2.0,
    rate=0.25, burst=3.0, per_cost=True, type_rate=2.0, type_burst=5.0,
    tenant="acme", tenant_weight=2.0, tenant_cap=6, tenant_rate=0.5, tenant_burst=4.0,
    tenant_per_cost=True,
)  # fmt: skip
ENDED = Done("u0", 41, 0.75, final=True)
RERUN = Running("u2", 42, "repack", 4, "", "repack:", "other", 3.25, 1.5, "other", 0.75)


def test_every_script_reads_argv_only_through_the_tables_names():
    defined = set(re.findall(r"\b((?:H|FIN|ASK|RUN|SWEEP)_[A-Z_]+)\b", lua_constants()))
    for name in ["common", *SCRIPTS]:
        text = code(name)
        for index in re.findall(r"ARGV\[([^\]]*)\]", text):
            # a list's count sits right after the head (HEAD + 1), its entries after it
            rest = re.sub(r"^HEAD \+ [12]\b", "", index)
            assert not re.search(r"\d", rest), (name, index)
        assert not re.search(r"\*\s*\d", text), name  # a stride written as a number
        used = set(re.findall(r"\b((?:H|FIN|ASK|RUN|SWEEP)_[A-Z_]+)\b", text))
        assert used <= defined, (name, used - defined)


#: The reply codes by their Lua names: each admission verdict (``V_<member>``) and each
#: finished job's status (``F_APPLIED``, ``F_STALE``).
CODES = {f"V_{v.name}": v.value for v in Verdict} | {
    "F_APPLIED": FINISH_APPLIED,
    "F_STALE": FINISH_STALE,
}
CODE_NAME = re.compile(r"\b([VF]_[A-Z_]+)\b")


def test_the_generated_code_names_are_the_verdict_enum_and_the_finish_statuses():
    lines = lua_constants().splitlines()
    generated = {}
    for i, line in enumerate(lines):
        if re.match(r"local [VF]_", line):  # "local A, B =" then "  'a', 'b'" below it
            names = line[len("local ") : -len(" =")].split(", ")
            values = re.findall(r"'([^']*)'", lines[i + 1])
            generated |= dict(zip(names, values, strict=True))
    assert generated == CODES
    assert all(re.fullmatch(r"[a-z_]+", value) for value in CODES.values())  # no quoting needed


def test_no_script_writes_a_reply_code_as_a_bare_string():
    # The standalone scripts (queued, holder, submission) answer no admission and no finished
    # job; queued.lua's 'key' is QueueFull's scope, another vocabulary.
    for name in ["common", *SCRIPTS]:
        literals = set(re.findall(r"'([^'\n]*)'|\"([^\"\n]*)\"", code(name)))
        written = {single or double for single, double in literals}
        assert not written & set(CODES.values()), (name, written & set(CODES.values()))


def test_every_status_a_script_gives_a_job_is_a_generated_code():
    for name in ["common", *SCRIPTS]:
        text = code(name)
        used = set(CODE_NAME.findall(text))
        assert used <= CODES.keys(), (name, used - CODES.keys())
        # a job's status, and the first field of each row of a reply's results
        for value in re.findall(r"\bstatus = (.*)", text):
            assert CODE_NAME.fullmatch(value.strip()), (name, value)
        for value in re.findall(r"results\[#results \+ 1\] = \{([^,}]*)", text):
            assert value == "status" or CODE_NAME.fullmatch(value), (name, value)
    # admit.lua gives every verdict the enum has; a new one must be added to both
    assert {n for n in CODE_NAME.findall(code("admit")) if n.startswith("V_")} == {
        f"V_{v.name}" for v in Verdict
    }


def test_each_script_starts_with_the_generated_names_it_uses_and_no_others():
    everything = lua_constants()
    for name in SCRIPTS:
        source = _source(name)
        head = lua_constants(source)
        assert source.startswith(head)
        body = source[len(head) :]
        defined = set(re.findall(r"\b([A-Z][A-Z_]*_[A-Z_]+|HEAD)\b", everything))
        used = {n for n in defined if re.search(rf"\b{n}\b", body)}
        given = set(re.findall(r"\b([A-Z][A-Z_]*_[A-Z_]+|HEAD)\b", head))
        assert given == used, (name, given ^ used)  # a script's locals are at most 200


def test_the_head_and_an_admission_are_packed_in_the_tables_order():
    s = store()
    args = s.admit_request("w1", [ASKED], [ENDED], ["git:watched"]).args
    head = dict(zip(HEAD, args, strict=False))
    assert (head["worker"], head["lease"], head["recovery"]) == ("w1", "12.5", "12.5")
    assert head["epoch"] == ""
    assert head["advance_idle"] in ("0", "1")
    assert head["token_seen"] == ""  # nothing seen yet
    assert len(HEAD) == 12
    assert args[len(HEAD)] == "1"
    fin = dict(zip(FINISHED, args[len(HEAD) + 1 :], strict=False))
    assert fin == {"uid": "u0", "token": "0:41", "elapsed": "0.75", "how": "1"}
    at = len(HEAD) + 1 + len(FINISHED)
    assert args[at] == "1"  # one job to admit
    asked = dict(zip(ASK, args[at + 1 : at + 1 + len(ASK)], strict=True))
    assert asked == {
        "uid": "u1",
        "type": "clone",
        "priority": "8",
        "tier_cap": "3",
        "type_cap": "",
        "conflict": "git:linux",
        "estimate_key": "clone:linux",
        "fairness_key": "tenant",
        "cost": "2.5",
        "default_cost": "1.0",
        "key_cap": "4",
        "weight": "0.5",
        "claim": "2.0",
        "rate": "0.25",
        "burst": "3.0",
        "per_cost": "1",
        "type_rate": "2.0",
        "type_burst": "5.0",
        "type_per_cost": "0",
        "tenant": "acme",
        "tenant_weight": "2.0",
        "tenant_cap": "6",
        "tenant_rate": "0.5",
        "tenant_burst": "4.0",
        "tenant_per_cost": "1",
    }
    assert args[at + 1 + len(ASK) :] == ["git:watched"]
    # Flat keys: no tenant weight says so (a tenant may be named "").
    flat = s.admit_request(
        "w1", [ASKED._replace(tenant=None, tenant_cap=None, tenant_rate=None)]
    ).args
    assert flat[-len(ASK) :][-6:-2] == ["", "", "", ""]


def test_a_registration_is_packed_in_the_tables_order():
    args = store().register_request("w1", [RERUN], keep=["u9"]).args
    assert args[len(HEAD)] == "1"
    b = len(HEAD) + 1
    assert dict(zip(RUNNING, args[b : b + len(RUNNING)], strict=True)) == {
        "uid": "u2",
        "token": "0:42",
        "type": "repack",
        "priority": "4",
        "conflict": "",
        "estimate_key": "repack:",
        "fairness_key": "other",
        "estimate": "3.25",
        "default_cost": "1.5",
        "tenant": "other",
        "tenant_charge": "0.75",
    }
    assert args[b + len(RUNNING) :] == ["1", "u9"]


def test_the_lease_renewal_share_is_one_constant_for_the_scripts_and_the_engine():
    assert f"local RENEW_EVERY = {RENEW_EVERY!r}" in lua_constants()
    common = (resources.files("celery_fair.store") / "lua" / "common.lua").read_text()
    assert "renew_at = now + lease * RENEW_EVERY" in common
    assert lease_held_for(8.0) == 8.0 * (1 - RENEW_EVERY) == 6.0


def test_the_token_halves_are_one_definition_for_the_scripts_and_python():
    constants = lua_constants()
    assert f"local TOKEN_LOW = {1 << TOKEN_LOW_BITS}" in constants
    assert f"local TOKEN_TICKS_PER_S = {TOKEN_TICKS_PER_S}" in constants
    common = (resources.files("celery_fair.store") / "lua" / "common.lua").read_text()
    assert "math.floor(now * TOKEN_TICKS_PER_S)" in common
    assert "if token >= TOKEN_LOW then" in common
    token = first_token(1700000000.5) + 7
    assert pack_token(token) == "1700000000500:7"
    assert unpack_token(*pack_token(token).split(":")) == token


def test_the_lane_rules_constants_and_operations_are_one_definition_for_lua_and_python():
    constants = lua_constants()
    assert f"local LANE_GRACE = {float(GRACE)!r}" in constants
    assert f"local LANE_EMPTY_SWEEPS = {EMPTY_SWEEPS}" in constants
    assert f"local LANE_VERSION_TICKS_PER_S = {LANE_VERSION_TICKS_PER_S}" in constants
    ops = ", ".join(f"OP_{op.upper()}" for op in LANE_OPS)
    assert f"local {ops} =" in constants
    lanes = code("lanes")
    assert "now - a.leaving >= LANE_GRACE" in lanes
    assert ">= LANE_EMPTY_SWEEPS" in lanes
    assert "math.floor(now * LANE_VERSION_TICKS_PER_S)" in lanes
    assert {f"OP_{op.upper()}" for op in LANE_OPS} <= set(re.findall(r"\bOP_[A-Z]+\b", lanes))
    # no operation's name, and neither constant, written again as a literal
    assert not set(re.findall(r"'([a-z]+)'", lanes)) & set(LANE_OPS)
    assert not re.search(r"\b3\.0\b|[<>=]=?\s*2\b", lanes)
    assert first_lane_version(1.5) == 1_500_000


def test_a_lane_sweep_is_packed_in_the_tables_order():
    args = store().sweep_lanes_request("w1", 4, [3, 1, 3], [3, 7]).args
    assert args[HEAD.index("worker")] == "w1"
    assert args[len(HEAD)] == "sweep"
    b = len(HEAD) + 1
    assert dict(zip(SWEEP, args[b : b + len(SWEEP)], strict=True)) == {
        "size": "4",
        "lease": "10.0",
        "looked": "2",
    }
    assert args[b + len(SWEEP) :] == ["1", "3", "3"]  # looked at, then found empty
