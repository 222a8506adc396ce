"""The local server keeps each result FUTURE_TTL_S after it finished, for the SDK's polls, and lets
the oldest go first: what a new request costs does not grow with the results a long session made."""

from __future__ import annotations

import time

from machine_nb.engines.local import server


def test_finished_results_go_after_their_ttl_oldest_first_and_unfinished_ones_stay(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    futures = server._Futures()
    a, b, pending = futures.new("asample"), futures.new("asample"), futures.new("forward_backward")
    futures.resolve_json(a, {"ok": 1})
    clock[0] += 5
    futures.resolve(b, b"\x00", "application/x-protobuf")
    futures.resolve_json(a, {"ok": 2})  # a second resolve neither moves nor repeats it
    clock[0] += server.FUTURE_TTL_S - 1
    futures.new("asample")  # a's finish is more than the TTL ago, b's not yet
    assert futures.get(a.request_id) is None and futures.get(b.request_id) is b
    clock[0] += 2
    futures.new("asample")
    assert futures.get(b.request_id) is None
    assert futures.get(pending.request_id) is pending  # never finished: still waited on
    assert len(futures._finished) == 0


def test_a_new_request_does_not_look_at_every_kept_result(monkeypatch):
    futures = server._Futures()
    for _ in range(20_000):
        futures.resolve_json(futures.new("asample"), {})
    seen = []
    monkeypatch.setattr(server._Future, "finished_at", property(lambda f: seen.append(1) or f.__dict__["finished_at"],
                                                               lambda f, v: f.__dict__.__setitem__("finished_at", v)),
                        raising=False)
    futures.new("asample")
    assert len(seen) <= 1  # the oldest result's finish time, not all 20,000
