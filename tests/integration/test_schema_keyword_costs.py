"""Keywords whose work is not one step per value, through a real bin/api
(docs/reference/input-schema.md, security.md "Validating a body has a bound no schema can
lift"): `uniqueItems` over an array whose items cannot be sorted together is jsonschema's
pairwise comparison, quadratic in the items; `multipleOf` with a fractional divisor
divides the body's integer as a float, which overflows past 309 digits (a 500). An
anonymous sender chooses both bodies; the ordinary schemas below are what publishers
write."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import requests

from tests.integration.test_schema_bounds import definition, hook
from tests.support.api import Api


def test_unique_items_over_unsortable_items_costs_linear_time(api: str, api_key: str) -> None:
    client = Api(api, api_key)
    client.publish("tagged", definition({"properties": {"tags": {"uniqueItems": True}}}))
    # A string first, so Python cannot sort the items (str < int) and jsonschema compares
    # every pair: 50 million comparisons in a 60 KB body of 9,998 values.
    distinct = ["x", *range(9_996)]
    repeated = ["x", *range(9_996), 9_995]
    # Three of each at once (more than the API's processes), and the health check beside.
    with ThreadPoolExecutor(max_workers=7) as pool:
        bodies = {pool.submit(hook, api, "tagged", {"tags": distinct}): 202 for _ in range(3)}
        bodies |= {pool.submit(hook, api, "tagged", {"tags": repeated}): 422 for _ in range(3)}
        health = pool.submit(requests.get, f"{api}/healthz", timeout=120)
        answers = [(answer.result(), status) for answer, status in bodies.items()]
    assert health.result().status_code == 200
    for answer, status in answers:
        assert answer.status_code == status, answer.text
    # JSON's equality, not Python's: 1 and 1.0 are the same, true and 1 are not, nor are
    # objects with other members; member order does not matter.
    same = [[1, 1.0], [{"a": 1, "b": [2]}, {"b": [2.0], "a": 1}], [[1, "a"], [1, "a"]]]
    for tags in same:
        assert hook(api, "tagged", {"tags": tags}, timeout=120).status_code == 422, tags
    other = [[True, 1], [False, 0, None, ""], [{"a": 1}, {"a": True}], [[1], [1, 1]], ["1", 1]]
    for tags in other:
        assert hook(api, "tagged", {"tags": tags}, timeout=120).status_code == 202, tags


def test_multiple_of_a_fraction_takes_any_storable_integer(api: str, api_key: str) -> None:
    client = Api(api, api_key)
    client.publish("quarters", definition({"properties": {"n": {"multipleOf": 0.75}}}))
    huge = 10**400  # storable: integers may have up to 4,300 digits
    r = hook(api, "quarters", {"n": huge}, timeout=120)
    assert r.status_code == 422, r.text  # 4 * 10^400 / 3 is no whole number
    assert str(huge) not in r.text
    assert hook(api, "quarters", {"n": 3 * huge}, timeout=120).status_code == 202
    assert hook(api, "quarters", {"n": 1.5}, timeout=120).status_code == 202
    assert hook(api, "quarters", {"n": 1}, timeout=120).status_code == 422


def test_a_long_enum_is_looked_up_not_scanned(api: str, api_key: str) -> None:
    # Whoever may publish one workflow (a key scoped to it) writes the longest enum a
    # definition holds; each value checked against it was compared with every member in
    # turn, about 30 ms a value for objects: a 60 KB body held a process for minutes.
    members = [{"k": n} for n in range(18_000)]
    client = Api(api, api_key)
    client.publish("listed", definition({"items": {"enum": members}}))
    last = [{"k": 17_999}] * 4_000
    with ThreadPoolExecutor(max_workers=4) as pool:
        bodies = [pool.submit(hook, api, "listed", last) for _ in range(3)]
        health = pool.submit(requests.get, f"{api}/healthz", timeout=120)
        answers = [answer.result() for answer in bodies]
    assert health.result().status_code == 200
    for answer in answers:
        assert answer.status_code == 202, answer.text
    # The same values as jsonschema's equality: 1.0 is 1, true is not, order is free.
    client.publish("listed", definition({"enum": [1, {"a": [1], "b": None}, "x"]}))
    for body in (1.0, {"b": None, "a": [1.0]}, "x"):
        assert hook(api, "listed", body, timeout=120).status_code == 202, body
    for body in (True, {"a": [1]}, "X", None, [1]):
        r = hook(api, "listed", body, timeout=120)
        assert r.status_code == 422, body
        assert r.json()["errors"][0]["path"] == "$"


def test_errors_an_applicator_swallows_are_paid_for(api: str, api_key: str) -> None:
    # `anyOf` collects every error of a branch before it tries the next: 18 000 required
    # names each make one per value, 100 ms a value, while the budget counted one keyword.
    names = [f"p{n}" for n in range(18_000)]
    client = Api(api, api_key)
    client.publish("swallowed", definition({"items": {"anyOf": [{"required": names}, True]}}))
    with ThreadPoolExecutor(max_workers=4) as pool:
        bodies = [pool.submit(hook, api, "swallowed", [{}] * 5_000) for _ in range(3)]
        health = pool.submit(requests.get, f"{api}/healthz", timeout=120)
        answers = [answer.result() for answer in bodies]
    assert health.result().status_code == 200
    for answer in answers:
        assert answer.status_code == 422, answer.text
        assert "keyword evaluations" in answer.json()["detail"]
    # A few values against the same schema are checked as before.
    assert hook(api, "swallowed", [{}, {"p1": 1}], timeout=120).status_code == 202
