"""Hypothesis strategies for random traces, shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st

PRIORITIES = [1, 2, 3, 4, 8]
GROUPS = ["", "git", "blob"]
JOB_IDS = [None, "r1", "r2", "r3", "r4"]
KEYS = ["", "a", "b", "c", "d"]
# Two-level keys (separator "/"): tenants a and b of several keys, c and "" of one.
TENANT_KEYS = ["", "a/x", "a/y", "a/z", "b/x", "b/y", "a", "c"]
TENANT_POLICY_NAMES = ["a", "b", "c", "a/x", "a/*", "*/y", "*/*", "[ab]", "*"]

times = st.one_of(
    st.integers(min_value=0, max_value=12),
    st.sampled_from([0.1, 0.2, 0.3, 0.7, 1.5, 2.25, 3.1]),
)
# Multiples of 1/4: with them every sum and difference of times is exact, as aging's
# comparisons of waits with levels need for the core and the oracle to agree to the tick.
quarter_times = st.integers(min_value=0, max_value=48).map(lambda n: n / 4)
costs = st.one_of(st.none(), st.integers(0, 20), st.sampled_from([0.1, 0.3, 2.5, 7.7]))


@st.composite
def job_types(draw):
    n = draw(st.integers(1, 4))
    types = {}
    for i in range(n):
        spec = {"priority": draw(st.sampled_from(PRIORITIES))}
        if draw(st.booleans()):
            spec["max_concurrency"] = draw(st.integers(0, 4))
        group = draw(st.sampled_from(GROUPS))
        if group:
            spec["conflict_group"] = group
        if draw(st.booleans()):
            spec["default_cost"] = draw(st.sampled_from([0, 1, 2.5, 10]))
        types[f"t{i}"] = spec
    return types


WEIGHTS = [1, 0.5, 2, 3, 0.3]


@st.composite
def key_policies(draw, *, runnable=False, bounds=False, rates=False, tenants=False):
    """Policies by fairness key, as a trace's ``keys``: exact names, a pattern, a default;
    with ``bounds``, some with a ``max_priority``; with ``rates``, some with a rate (per job,
    at rates whose refills fall on quarter seconds, as ``quarter_times``); with ``tenants``,
    named for two-level keys (tenants' and keys' entries)."""
    choices = TENANT_POLICY_NAMES if tenants else [*KEYS, "[ab]", "?", "*"]
    names = draw(st.lists(st.sampled_from(choices), max_size=4, unique=True))
    out = {}
    for name in names:
        policy = {}
        if draw(st.booleans()):
            policy["weight"] = draw(st.sampled_from(WEIGHTS))
        if draw(st.booleans()):
            policy["max_concurrency"] = draw(st.integers(1 if runnable else 0, 3))
        if draw(st.booleans()):
            policy["min_slots"] = draw(st.integers(0, 3))
        if bounds and draw(st.booleans()):
            policy["max_priority"] = draw(st.sampled_from(PRIORITIES))
        if rates and draw(st.booleans()):
            policy.update(draw(rate_terms()))
        out[name] = policy
    return out


@st.composite
def rate_terms(draw):
    """A key's or a type's rate (per job, at rates whose refills fall on quarter seconds, as
    ``quarter_times``), with a burst or not."""
    terms: dict = {"rate": draw(st.sampled_from(["1/s", "2/s", "4/s", "1/2s", "1/4s", 0.5]))}
    if draw(st.booleans()):
        terms["burst"] = draw(st.sampled_from([1, 2, 3]))
    return terms


@st.composite
def agings(draw):
    """An aging configuration, as a trace's or a type's ``aging``."""
    aging = {"interval": draw(st.sampled_from([0.5, 1, 2, 4]))}
    if draw(st.booleans()):
        aging["grace"] = draw(st.sampled_from([0, 0.5, 1, 3]))
    if draw(st.booleans()):
        aging["ceiling"] = draw(st.sampled_from([*PRIORITIES, 5, 9]))
    if draw(st.booleans()):
        aging["urgent"] = draw(st.sampled_from([2, 4, 5, 8, 9]))
    return aging


@st.composite
def pauses(draw, types, when=None, keys=KEYS, tenants=False):
    """Pauses of keys and types; with ``tenants``, of tenants too (the part before "/")."""
    out = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["key", "type", "tenant"] if tenants else ["key", "type"]))
        if kind == "key":
            pause = {"key": draw(st.sampled_from(keys))}
        elif kind == "tenant":
            pause = {"tenant": draw(st.sampled_from(keys)).split("/", 1)[0]}
        else:
            pause = {"type": draw(st.sampled_from(sorted(types)))}
        pause["at"] = draw(times if when is None else when)
        if draw(st.booleans()):
            pause["until"] = pause["at"] + draw(times if when is None else when)
        out.append(pause)
    return out


@st.composite
def traces(
    draw,
    *,
    max_jobs=30,
    lifecycle=False,
    runnable=False,
    policies=False,
    aging=False,
    allocation_caps=False,
    bounds=False,
    by_key=False,
    rates=False,
    tenants=False,
):
    """A random trace; ``runnable`` makes every type able to run (caps >= 1); ``policies``
    adds weights and caps by key, and pauses (only ones that end, with ``runnable``);
    ``aging`` adds aging for the trace and some types, and draws every time from
    ``quarter_times``; ``allocation_caps`` makes each key's allocation its soft cap;
    ``bounds`` gives some jobs a priority of their own and (with ``policies``) some keys a
    ``max_priority``; ``by_key`` sets the priority scope ``"key"``; ``rates`` gives some types
    and (with ``policies``) some keys a rate, and draws every time from ``quarter_times``;
    ``tenants`` makes keys two-level (separator ``"/"``, ``TENANT_KEYS``)."""
    keys = TENANT_KEYS if tenants else KEYS
    when = quarter_times if aging or rates else times
    types = draw(job_types())
    if rates:
        for spec in types.values():
            if draw(st.integers(0, 3)) == 0:
                spec.update(draw(rate_terms()))
    if aging:
        for spec in types.values():
            if draw(st.integers(0, 3)) == 0:
                spec["aging"] = draw(agings())
    if runnable:
        for spec in types.values():
            if spec.get("max_concurrency") == 0:
                spec["max_concurrency"] = 1
    capacity = draw(st.integers(1, 6) if runnable else st.integers(0, 6))
    jobs = []
    for i in range(draw(st.integers(0, max_jobs))):
        job = {
            "name": f"j{i}",
            "type": draw(st.sampled_from(sorted(types))),
            "job_id": draw(st.sampled_from(JOB_IDS)),
            "fairness_key": draw(st.sampled_from(keys)),
            "arrival": draw(when),
            "duration": draw(when),
        }
        cost = draw(costs)
        if cost is not None:
            job["cost"] = cost
        if bounds and draw(st.integers(0, 2)) == 0:
            job["priority"] = draw(st.sampled_from(PRIORITIES))
        jobs.append(job)
    trace = {"capacity": capacity, "types": types, "jobs": jobs}
    if draw(st.booleans()):
        trace["alpha"] = draw(st.sampled_from([0.3, 0.5, 1.0, 0.05]))
    if draw(st.booleans()):
        tier = draw(st.sampled_from(PRIORITIES))
        trace["tier_caps"] = {
            str(tier): draw(st.one_of(st.none(), st.integers(1 if runnable else 0, 5)))
        }
    if lifecycle:
        life = {}
        if draw(st.booleans()):
            life["cost_ttl"] = draw(st.sampled_from([0.5, 1, 3, 7.5]))
        if draw(st.booleans()):
            life["estimate_ttl"] = draw(st.sampled_from([0.5, 2, 5]))
        if draw(st.booleans()):
            life["reset_interval"] = draw(st.sampled_from([1, 2.5, 6]))
        if draw(st.booleans()):
            life["advance_idle"] = True
        trace["lifecycle"] = life
    if policies:
        trace["keys"] = draw(
            key_policies(runnable=runnable, bounds=bounds, rates=rates, tenants=tenants)
        )
        trace["pauses"] = [
            p
            for p in draw(pauses(types, when, keys, tenants))
            if not runnable or p.get("until") is not None
        ]
    if aging and draw(st.integers(0, 3)):
        trace["aging"] = draw(agings())
    if allocation_caps:
        trace["allocation_caps"] = True
    if by_key:
        trace["priority_scope"] = "key"
    if tenants:
        trace["key_separator"] = "/"
    return trace
