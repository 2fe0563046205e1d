"""Tests of a live fleet: the local spot market (`trainer.providers.market.SpotMarket`: grants up to its capacity,
refusals, open requests, boots, reclaims with and without notice), the driver's request policy and history
(`trainer.control.fleet.FleetController`: backoff, rows), the never-peek property on a virtual clock (two market
traces identical up to interval k give identical plans up to k), the settings' checks, and real jobs under the
market: through `trainer.train` (the uninterrupted run's losses, a fleet history that follows the capacity) and
through `parcae train` exactly as the issue writes it.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import mlflow
import pytest
import torch
from _mlflow import temporary_mlflow_store
from _paced import paced_gpt
from _reference import uninterrupted_losses
from _trainer_fixtures import _no_orphans, _one_thread, market_job  # noqa: F401  (autouse fixtures)
from typer.testing import CliRunner

from forecasting import COMPACT_AT, TraceStore, training_corpus
from parcae.cli import app
from trainer.config import (
    AvailabilityConfig,
    CheckpointConfig,
    ConfigError,
    FleetConfig,
    JobConfig,
    ProviderConfig,
    TrainConfig,
    model_config,
)
from trainer.control.fleet import FleetController, FleetRow, fleet_cost, fleet_cost_text
from trainer.control.planning import PlanRequest, RulePlanner
from trainer.control.run import train
from trainer.observe.observer import RecordingObserver
from trainer.observe.tracking import MlflowJobObserver
from trainer.providers import provider_of
from trainer.providers.fleet import CapacityAnswer
from trainer.providers.market import (
    PENDING,
    REFUSED,
    MarketError,
    MarketOptions,
    MarketStep,
    SpotMarket,
    market_capacity,
)

# ------------------------------------------------------------------------------------------------ the market


def test_the_market_grants_up_to_its_capacity_and_refuses_the_rest():
    m = SpotMarket([2, 3, 1], interval_s=10.0, start=100.0, seed=0)
    assert [m.capacity(t) for t in (100.0, 109.9, 110.0, 125.0, 1e6)] == [2, 2, 3, 1, 1]  # the last one holds
    a = m.request(3, now=100.0)
    assert a == CapacityAnswer(3, granted=(0, 1), refused=1, reason=REFUSED)
    assert m.request(1, now=105.0) == CapacityAnswer(1, refused=1, reason=REFUSED)
    assert m.request(1, now=110.0) == CapacityAnswer(1, granted=(2,))  # interval 1 has room for one more
    m.release([0])  # an instance the job ended frees its place
    assert m.request(1, now=111.0).granted == (3,)
    with pytest.raises(ValueError, match="at least one"):
        m.request(0, now=111.0)


def test_an_open_request_is_filled_when_capacity_comes():
    m = SpotMarket([1, 1, 3], interval_s=1.0, start=0.0, open_requests=True, boot_s=0.5)
    a = m.request(3, now=0.0)
    assert a == CapacityAnswer(3, granted=(0,), pending=2, reason=PENDING)
    assert m.advance(0.2).booted == []  # still booting
    assert m.advance(0.6).booted == [0]
    assert m.advance(1.5).booted == [] and m.pending == 2
    assert m.advance(2.0).booted == [] and m.pending == 0 and m.booting() == 2  # granted at 2.0, up at 2.5
    assert m.advance(2.5).booted == [1, 2]


def test_a_fall_in_capacity_reclaims_with_notice_or_a_seeded_share_without():
    def fall(kill_fraction: float, seed: int = 0):
        m = SpotMarket([4, 1], interval_s=1.0, start=0.0, seed=seed, kill_fraction=kill_fraction)
        m.request(4, now=0.0)
        assert m.advance(0.0).booted == [0, 1, 2, 3]
        return m, m.advance(1.0)

    m, step = fall(0.0)
    assert len(step.noticed) == 3 and not step.killed and len(m.held) == 1
    _, step = fall(1.0)
    assert len(step.killed) == 3 and not step.noticed
    _, a = fall(0.5, seed=3)
    _, b = fall(0.5, seed=3)
    assert (a.noticed, a.killed) == (b.noticed, b.killed)  # seeded: the same victims, the same way
    assert len(a.noticed) + len(a.killed) == 3
    # an instance reclaimed while it boots never ran: dropped, neither noticed nor killed
    m = SpotMarket([2, 0], interval_s=1.0, start=0.0, boot_s=5.0)
    m.request(2, now=0.0)
    step = m.advance(1.0)
    assert step.dropped == [0, 1] and not step.noticed and not step.killed and m.booting() == 0


def test_a_fall_is_warned_notice_s_ahead_and_reclaims_when_it_comes():
    """As a cloud warns before it reclaims: the instances a fall at 20 s takes are warned 4 s ahead, with the fall
    as their deadline, and leave the market's count only then; those reclaimed without notice go at the fall."""

    def market(kill_fraction: float) -> SpotMarket:
        m = SpotMarket([3, 3, 1], interval_s=10.0, start=0.0, seed=0, kill_fraction=kill_fraction, notice_s=4.0)
        m.request(3, now=0.0)
        assert m.advance(0.0).booted == [0, 1, 2]
        assert m.advance(15.9) == MarketStep()  # the fall is more than 4 s away: nothing yet
        return m

    m = market(0.0)
    step = m.advance(16.5)
    assert len(step.noticed) == 2 and step.deadline == {w: 20.0 for w in step.noticed} and not step.killed
    assert len(m.held) == 3 and m.request(1, now=17.0).refused == 1  # the warned still hold their places
    m.release([w for w in m.held if w not in step.noticed])  # the one staying ends: two places are free now, but
    a = m.request(2, now=17.0)  # one only at the fall that a notice given now reaches: one is offered
    assert len(a.granted) == 1 and a.refused == 1
    assert m.advance(19.9) == MarketStep(booted=list(a.granted))  # warned once
    assert m.advance(20.0) == MarketStep() and len(m.held) == 1  # reclaimed at the fall
    m = market(1.0)
    assert m.advance(16.5) == MarketStep() and len(m.held) == 3  # no warning for those killed ...
    step = m.advance(20.0)
    assert len(step.killed) == 2 and not step.noticed and len(m.held) == 1  # ... at the fall
    # a reclaim a request's advance found is reported by the next advance, not lost
    m = SpotMarket([2, 1], interval_s=1.0, start=0.0, seed=0, kill_fraction=1.0)
    m.request(2, now=0.0)
    m.advance(0.0)
    assert m.request(1, now=1.0).refused == 1
    assert len(m.advance(1.0).killed) == 1 and len(m.held) == 1


def test_market_options_and_capacity_name_the_fix():
    assert MarketOptions.from_mapping({"trace": "p3"}).notice_s == 2.0
    market = provider_of(
        JobConfig(provider=ProviderConfig("market", {"trace": "p3"}), fleet=FleetConfig(max_instances=2))
    )
    assert market.instance_type({"trace": "p3"}) == "p3.2xlarge"  # what its fleet's cost is counted at, unless told
    assert market.instance_type({"trace": "p3", "instance_type": "g5.xlarge"}) == "g5.xlarge"
    for options, match in [({}, "needs a trace"), ({"trace": "p3", "boot": 1}, "no option 'boot'"),
                           ({"trace": "p3", "kill_fraction": 2}, "kill_fraction"),
                           ({"trace": "p3", "notice_s": -1}, "notice_s"),
                           ({"trace": "p3", "open_requests": "yes"}, "open_requests"),
                           ({"trace": "p3", "instance_type": ""}, "instance_type: expected")]:  # fmt: skip
        with pytest.raises(MarketError, match=match):
            MarketOptions.from_mapping(options)
    cap = market_capacity("p3", 4, start_interval=44)
    assert max(cap) == 4 and cap[:7] == [4] * 7 and cap[7] == 3  # p3 scaled to 4: the first fall at interval 51
    with pytest.raises(MarketError, match="outside the trace"):
        market_capacity("p3", 4, start_interval=10**6)
    with pytest.raises(MarketError, match="trace 'no-such-trace': unknown trace"):  # (a LookupError, not a KeyError)
        market_capacity("no-such-trace", 4)


def test_the_market_follows_a_live_fleet_s_history(tmp_path, monkeypatch):
    """`--market-trace fleet:<job tag>`: the local market replays the capacity a team's own fleet got (from the
    trace store), scaled as any trace."""
    TraceStore(tmp_path / "store").append("fleet_intervals", [
        {"job_tag": "prod@1", "provider": "aws", "interval": i, "interval_s": 60.0, "capacity": 8, "requested": 0,
         "granted": 0, "refused": 0, "reclaimed": 0, "alive": n, "timestamp": "2026-12-01T00:00:00Z"}
        for i, n in enumerate([8, 6, 4, 8])])  # fmt: skip
    monkeypatch.setenv("PARCAE_TRACE_STORE", str(tmp_path / "store"))
    assert market_capacity("fleet:prod@1", 4) == [4, 3, 2, 4]
    assert market_capacity("fleet:prod@1", 8, start_interval=1) == [6, 4, 8]
    with pytest.raises(MarketError, match="no live fleet 'fleet:dev@1' in the trace store .*fleet:prod@1"):
        market_capacity("fleet:dev@1", 4)


# ------------------------------------------------------------------------------------------------ the requests


def test_refused_requests_back_off_doubling_and_a_granted_one_resets():
    f = FleetController(FleetConfig(max_instances=4), interval_s=4.0, start=0.0)
    assert f.ask(0.0, have=0, outstanding=0) == 4
    f.answered(CapacityAnswer(4, granted=(0,), refused=3, reason=REFUSED), 0.0)
    assert f.ask(0.5, have=1, outstanding=0) == 0  # backing off for a quarter interval
    assert f.ask(1.0, have=1, outstanding=0) == 3
    f.answered(CapacityAnswer(3, refused=3, reason=REFUSED), 1.0)
    assert f.ask(2.9, 1, 0) == 0 and f.ask(3.0, 1, 0) == 3  # half an interval
    for t in (3.0, 5.0, 7.0, 9.0, 11.0):  # then capped there (MAX_BACKOFF_INTERVALS): twice an interval
        f.answered(CapacityAnswer(3, refused=3, reason=REFUSED), t)
    assert f.ask(12.9, 1, 0) == 0 and f.ask(13.0, 1, 0) == 3
    f.answered(CapacityAnswer(3, refused=3, reason=REFUSED), 13.0)
    assert f.ask(14.9, 1, 0) == 0 and f.ask(15.0, 1, 0) == 3
    f.answered(CapacityAnswer(3, granted=(1, 2, 3)), 15.0)
    assert f.ask(15.0, have=1, outstanding=3) == 0  # nothing lacks: the granted ones are on their way
    assert f.ask(15.0, have=2, outstanding=0) == 2  # and no backoff after a whole grant
    f.reclaimed(2)
    row = f.close(16.0, alive=2)
    assert row.to_dict() == {"t": 16.0, "requested": 28, "granted": 4, "alive": 2, "refused": 24, "reclaimed": 2}
    assert f.close(17.0, alive=2).requested == 0  # counts are per interval
    slow = FleetController(FleetConfig(max_instances=2, backoff_s=10.0, max_backoff_s=20.0), 4.0, start=0.0)
    slow.answered(CapacityAnswer(2, refused=2, reason=REFUSED), 0.0)
    assert slow.ask(9.9, 0, 0) == 0 and slow.ask(10.0, 0, 0) == 2


def test_the_fleet_s_cost_counts_every_instance_held_from_its_grant_to_its_end_at_the_bundled_prices():
    f = FleetController(FleetConfig(max_instances=4), interval_s=60.0, start=100.0)
    f.hold(100.0, 2)  # two booting
    f.hold(130.0, 3)  # 30 s later: a third granted
    f.hold(190.0, 1)  # 60 s later: two taken by the cloud
    f.hold(250.0, 0)  # the job's end
    assert f.instance_seconds == 2 * 30 + 3 * 60 + 1 * 60
    f.hold(400.0, 0)  # nothing held since
    assert f.instance_seconds == 300.0
    f.hold(500.0, 1)
    f.hold(510.0, 1)  # polled again, the same instance held: one span
    f.hold(520.0, 0)
    own = (None, None)  # (the provider's own type, its zone not known)
    assert f.spans == [(100.0, 130.0, {own: 2}), (130.0, 190.0, {own: 3}), (190.0, 250.0, {own: 1}),
                       (500.0, 520.0, {own: 1})]  # fmt: skip
    cost = fleet_cost(3600.0, "p3.2xlarge", samples=1_000_000)
    assert cost == {"instance_hours": 1.0, "instance_type": "p3.2xlarge", "time_scale": 1.0, "spot_usd": 0.612,
                    "on_demand_usd": 3.06, "usd_per_million_samples": 0.612, "prices_as_of": "2025-06-28"}  # fmt: skip
    assert fleet_cost_text(cost) == ("fleet: 1.00 instance-hours of p3.2xlarge, $0.61 at spot ($3.06 on demand; "
                                     "prices as of 2025-06-28)")  # fmt: skip
    market = fleet_cost(60.0, "p3.2xlarge", samples=0, time_scale=60.0)  # a market's second: its trace's minute
    assert market["instance_hours"] == 1.0 and market["usd_per_million_samples"] is None
    assert fleet_cost_text(market).startswith("fleet: 1.00 instance-hours of p3.2xlarge (in the market's trace time: "
                                              "60x the wall clock), $0.61 at spot")  # fmt: skip
    unknown = fleet_cost(1800.0, "x9.huge", samples=10)
    assert unknown["instance_hours"] == 0.5 and "spot_usd" not in unknown
    assert "no price for instance type 'x9.huge'; known: p3.2xlarge" in fleet_cost_text(unknown)
    assert fleet_cost(0.0, None, 0)["unpriced"] == "the provider names no instance type"


def test_a_fleet_of_several_instance_types_is_counted_and_priced_by_type():
    """An AWS fleet over several capacity pools holds instances of several types: each type's hours are its own,
    priced at its own price — a type without one leaves the fleet unpriced, naming it, not priced as another."""
    f = FleetController(FleetConfig(max_instances=4), interval_s=60.0, start=0.0)
    f.hold(0.0, {"p3.2xlarge": 2, None: 1})  # one still booting: of the provider's own type
    f.hold(1800.0, {"p3.2xlarge": 2, "p3.8xlarge": 1})
    f.hold(3600.0, 0)
    assert f.instance_seconds_by_type == {"p3.2xlarge": 7200.0, None: 1800.0, "p3.8xlarge": 1800.0}
    assert f.instance_seconds == 10800.0
    mixed = fleet_cost(f.instance_seconds_by_type, "p3.2xlarge", samples=100)
    assert mixed["instance_hours"] == 3.0 and mixed["instance_type"] == "p3.2xlarge"
    assert mixed["instance_hours_by_type"] == {"p3.2xlarge": 2.5, "p3.8xlarge": 0.5}
    assert "spot_usd" not in mixed and "no price for instance type 'p3.8xlarge'" in mixed["unpriced"]
    assert fleet_cost_text(mixed).startswith("fleet: 3.00 instance-hours of p3.2xlarge (2.50), p3.8xlarge (0.50); "
                                             "not priced: no price for instance type 'p3.8xlarge'")  # fmt: skip
    # all of the provider's own type, counted by type: the same cost as the total
    own = fleet_cost({"p3.2xlarge": 2700.0, None: 900.0}, "p3.2xlarge", samples=1_000_000)
    assert own == fleet_cost(3600.0, "p3.2xlarge", samples=1_000_000)


def fleet_plans(capacity: list[int], intervals: int, seed: int = 0) -> list[tuple[int, int, tuple[int, int]]]:
    """A live fleet on a virtual clock: the real `FleetController` asking the real `SpotMarket` (instances up
    as soon as granted, reclaims taking them at once), planned every interval by the rule planner from the fleet's
    history, as the driver plans. Returns (interval, alive, decision) per plan."""
    market = SpotMarket(capacity, interval_s=1.0, start=0.0, seed=seed, kill_fraction=0.5)
    fleet = FleetController(FleetConfig(max_instances=4), interval_s=1.0, start=0.0)
    planner, alive, history, current = RulePlanner(), set(), [], (1, 1)
    out = []
    for tick in range(intervals * 10):
        now = tick / 10
        step = market.advance(now)
        alive |= set(step.booted)
        gone = set(step.noticed) | set(step.killed)
        alive -= gone
        if gone:
            fleet.reclaimed(len(gone))
        n = fleet.ask(now, len(alive), market.booting() + market.pending)
        if n:
            fleet.answered(market.request(n, now), now)
        if tick % 10 == 9 and alive:
            fleet.close(now, len(alive))
            history.append(len(alive))
            req = PlanRequest(interval=len(history), step=tick, alive=len(alive), current=current,
                              history=tuple(history), n_layers=6, global_batch=16)  # fmt: skip
            current, _ = planner(req)
            out.append((req.interval, req.alive, current))
    return out


def test_the_job_never_peeks_two_markets_alike_up_to_k_plan_alike_up_to_k():
    k = 6
    a = [1, 2, 4, 4, 3, 4, 4, 2, 1, 1, 4, 4]
    b = a[:k] + [4, 1, 4, 3, 2, 2]  # the same first k intervals, another future
    pa, pb = fleet_plans(a, len(a)), fleet_plans(b, len(b))
    assert pa[:k] == pb[:k]
    assert pa != pb  # the futures differ, and the plans then do: the test can fail
    assert [alive for _, alive, _ in pa[:k]] == [1, 2, 4, 4, 3, 4]  # alive follows the capacity, interval by interval


# ------------------------------------------------------------------------------------------------ the settings


def test_a_fleet_replays_nothing_and_the_market_runs_only_a_fleet(tmp_path):
    market = ProviderConfig(name="market", options={"trace": "p3"})
    with pytest.raises(ConfigError, match="provider 'market' runs a live fleet only"):
        provider_of(JobConfig(out_dir=str(tmp_path), provider=market))
    with pytest.raises(ConfigError, match="replays no trace"):
        JobConfig(out_dir=str(tmp_path), provider=market, fleet=FleetConfig(max_instances=4),
                  availability=AvailabilityConfig(trace="p3"))  # fmt: skip
    with pytest.raises(ConfigError, match="provider 'local' runs no live fleet; choose one that does: aws, market"):
        provider_of(JobConfig(out_dir=str(tmp_path), fleet=FleetConfig(max_instances=4)))
    with pytest.raises(ConfigError, match="fleet.min_instances: 5 is above fleet.max_instances"):
        FleetConfig(max_instances=4, min_instances=5)
    with pytest.raises(ConfigError, match="fleet.backoff_s"):
        FleetConfig(max_instances=4, backoff_s=0)
    cfg = JobConfig(out_dir=str(tmp_path), provider=market, fleet=FleetConfig(max_instances=4))
    assert JobConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


# ------------------------------------------------------------------------------------------------ real jobs

CFG = model_config("tiny-gpt", dtype="float64")


def reference(steps: int, **train: Any) -> list[float]:
    return uninterrupted_losses(CFG, TrainConfig(**train), steps)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    yield from temporary_mlflow_store(tmp_path_factory)


class ScriptedRule(RulePlanner):
    """The rule, after one stage for interval 1 and two for interval 2: so that, however many instances had joined
    when training started, the job re-cuts its pipeline (a pipeline migration) before the rule takes it to 2x2."""

    def __call__(self, req: PlanRequest):
        if req.interval <= 2:
            return (1, min(req.interval, req.alive)), {"rule": "scripted start"}
        return super().__call__(req)


def test_a_job_under_the_p3_market_makes_every_migration_kind_and_trains_the_uninterrupted_run(tmp_path, store):
    """p3 from interval 41 as the market's capacity, scaled to 4 instances, one interval a second (the job never
    reads it): 4 for 10 s, then 3 for 6, then 2. The job fills up to 4, plans every interval from the fleet's own
    history, re-cuts its pipeline, grows to 2x2 (inter-stage), hands the noticed instances' layers off live when the
    market falls (2x2 -> 1x2: intra-stage), and trains the uninterrupted run. (Its steps paced to 0.1 s, about
    this machine's own at 2x2: 220 of them train past the fall to 2 at 16 s on any machine — 300 unpaced, sized for
    a faster one, took 40-61 s here.)"""
    steps = 220
    config = market_job(
        tmp_path / "job",
        "p3",
        steps=steps,
        max_instances=4,
        model=paced_gpt(0.1),
        train={"global_batch": 8},  # (half the default's compute: the pace, not this CPU, sets a step's time)
        checkpoint=CheckpointConfig(every=10),
        options={"start_interval": 41, "seed": 0, "kill_fraction": 0.0},
        fleet={"min_instances": 1, "trace_store": str(tmp_path / "store")},
    )
    capacity = market_capacity("p3", 4)[41:]
    assert capacity[:17] == [4] * 10 + [3] * 6 + [2]
    for i in range(COMPACT_AT):  # an earlier fleet's history, a part file per interval: the job's end compacts it
        TraceStore(tmp_path / "store").append("fleet_intervals", [{
            "job_tag": "earlier@1", "provider": "market", "interval": i, "interval_s": 60.0, "capacity": 4,
            "requested": 1, "granted": 1, "refused": 0, "reclaimed": 0, "alive": 1, "timestamp": "2026-12-01",
        }])  # fmt: skip
    obs = MlflowJobObserver(flush_every_s=0.5)
    report = train(config, planner=ScriptedRule(), observer=obs)
    assert obs.closed and obs.run_id is not None
    assert report["loss"] == pytest.approx(reference(steps, global_batch=8), rel=1e-6)  # float64: uninterrupted
    kinds = {r["kind"] for r in report["reconfigurations"]}
    assert kinds >= {"pipeline", "inter-stage", "intra-stage"}, report["reconfigurations"]
    noticed = [r for r in report["reconfigurations"] if r["preempted"]]
    assert noticed and all(r["notice"] and r["steps_lost"] == 0 for r in noticed)  # handed off live, no step lost
    rows = report["fleet"]
    assert all(set(r) == {"t", "requested", "granted", "alive", "refused", "reclaimed"} for r in rows)
    assert all(r["requested"] <= 4 * 4 for r in rows[1:])  # at most four asks an interval (no request storm)

    # alive follows the market (its clock: seconds since the fleet started asking) within one interval, once the
    # first instances have started their workers: never above its capacity, down and up with it within an interval
    # (a refused fleet asks again within half an interval; a granted instance's worker starts and joins) — down
    # ahead of a fall by up to the market's notice (2 s: the warned hand off and leave before it, as on a cloud)
    def cap(t: float) -> int:
        return capacity[min(max(int(t), 0), len(capacity) - 1)]

    alive = [r["alive"] for r in rows]
    assert 4 in alive and sum(r["reclaimed"] for r in rows) >= 1  # filled up to 4, then reclaimed from
    full = alive.index(4)
    for r in rows[full:]:
        assert r["alive"] <= max(cap(r["t"] - 1.0), cap(r["t"])), rows
        assert r["alive"] >= min(cap(r["t"] - 1.0), cap(r["t"]), cap(r["t"] + 2.0)), rows
    plans = report["plans"]
    assert [p["interval"] for p in plans] == list(range(1, len(plans) + 1)) and len(plans) >= 5
    assert all(p["decision"][0] * p["decision"][1] <= p["alive"] for p in plans)
    assert [p["alive"] for p in plans] == [r["alive"] for r in rows][1 : len(plans) + 1]  # from the fleet's history
    # the planner was asked a step ahead (control.prepare): a plan's epoch formed its groups during that step (unless
    # a notice or an arrival meanwhile made the boundary decide another one)
    planned = [r for r in report["reconfigurations"] if r["source"] == "planner"]
    assert any(r["prepared"] for r in planned), [(r["step"], r["kind"], r["prepared"]) for r in planned]
    # the trace store holds the fleet's history, one row per interval, and the forecaster's corpus takes it
    history = report["fleet_history"]
    assert history["rows"] == len(rows) and not history["errors"]
    # compacted (every COMPACT_AT rows of the job's, and at its end): fewer parts than the threshold are left
    assert len(TraceStore(tmp_path / "store").parts("fleet_intervals")) < COMPACT_AT
    stored = TraceStore(tmp_path / "store").read("fleet_intervals")
    assert set(stored["job_tag"]) == {history["job_tag"], "earlier@1"} and history["job_tag"].startswith("job@")
    stored = stored[stored["job_tag"] == history["job_tag"]]
    assert stored["alive"].tolist() == alive and set(stored["interval_s"]) == {60.0}  # the trace's own interval
    corpus = training_corpus(store=TraceStore(tmp_path / "store"))
    fleet_table = corpus[f"fleet:{history['job_tag']}"]
    assert fleet_table["available"].tolist() == alive and int(fleet_table["capacity"].iloc[0]) == 4
    # the job's MLflow run holds the fleet's history, as a table and a figure
    client = mlflow.MlflowClient(obs.uri)  # (not the process's global URI, which another test may have set)
    assert {"fleet.json", "fleet.png"} <= {a.path for a in client.list_artifacts(obs.run_id)}
    table = json.loads(Path(client.download_artifacts(obs.run_id, "fleet.json", str(tmp_path))).read_text())
    assert table["columns"] == ["t", "requested", "granted", "alive", "refused", "reclaimed"]
    assert [row[3] for row in table["data"]] == alive
    # and what the fleet cost, beside the run's other summaries (runs compare in dollars)
    logged = client.get_run(obs.run_id).data.metrics
    cost = report["fleet_cost"]
    assert cost["instance_hours"] > 0 and cost["instance_type"] == "p3.2xlarge"
    assert {k: logged[f"fleet_{k}"] for k in ("instance_hours", "spot_usd", "on_demand_usd")} == pytest.approx(
        {k: cost[k] for k in ("instance_hours", "spot_usd", "on_demand_usd")})  # fmt: skip


class EveryInstanceAStage(RulePlanner):
    """One pipeline of every instance (up to 3: no standby to preempt), asking for the notices of the next eight
    intervals and keeping each request's (interval, alive, noticed)."""

    notices_ahead = 8

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, tuple[int, ...]]] = []

    def __call__(self, req: PlanRequest):
        self.seen.append((req.interval, req.alive, req.noticed))
        return (1, min(req.alive, 3)), {"rule": "every instance a stage"}


def test_a_noticed_instance_trains_on_until_the_last_plan_before_its_deadline(tmp_path):
    """A market of 3 instances that falls to 2 at 18 s and warns 8 s ahead (one interval a second; the warning at
    10 s): the noticed member keeps training through the plans that still come 5 s (`NOTICE_MARGIN_S`) before its
    deadline — told to the planner as leaving at a later one (`PlanRequest.noticed`) — and leaves at a plan's
    boundary, its layers handed off with no step lost: the uninterrupted run. (It used to leave at a boundary of its
    own at once; and, on a loaded machine, at one a step before the plan it was folded into, which came a little
    late: a fold made keeps its boundary on a smaller margin, `notice_margin_s(folded=True)`.) Enough steps
    that the job still trains when the member leaves (about 13 s in): 200 unpaced steps once ended in 12 s on a fast
    machine, and 360 took 44-68 s on this 2-core one; paced to 0.1 s a step (about this machine's own), 180 train for
    18 s or more anywhere."""
    (tmp_path / "capacity.csv").write_text("0,3\n1080000,2\n2400000,2\n")  # (ts_ms,count: 60 s a trace interval)
    steps, planner = 180, EveryInstanceAStage()
    config = market_job(tmp_path / "job", tmp_path / "capacity.csv", steps=steps, max_instances=3,
                        model=paced_gpt(0.1),
                        options={"seed": 0, "kill_fraction": 0.0, "notice_s": 8.0})  # fmt: skip
    config = dataclasses.replace(config, control=dataclasses.replace(config.control, notice_grace_s=8.0))
    report = train(config, planner=planner)
    assert report["loss"] == pytest.approx(reference(steps), rel=1e-6)
    (left,) = [r for r in report["reconfigurations"] if r["preempted"]]
    assert left["notice"] and left["steps_lost"] == 0, left
    at = {p["step"]: p["interval"] for p in report["plans"]}
    assert left["step"] in at, (left, at)  # a plan's boundary, its decision taking the notice in
    told = [(i, alive, noticed) for i, alive, noticed in planner.seen if noticed]
    assert told and all(alive == 3 and sum(noticed) == 1 for _, alive, noticed in told), planner.seen
    assert told[-1][0] == at[left["step"]] - 1 and told[-1][2] == (1,), planner.seen  # "leaving at the next plan"


def test_parcae_train_under_the_market_as_the_issue_writes_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PARCAE_TRACE_STORE", raising=False)
    out = tmp_path / "OUT.json"
    res = CliRunner().invoke(app, ["train", "--provider", "market", "--market-trace", "p3", "--fleet", "4",
                                   "--steps", "150", "--interval-seconds", "1", "--json", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert len(report["loss"]) == 150 and report["loss"][-1] < report["loss"][0]
    assert report["fleet_history"]["store"] == str((tmp_path / "trace-store").resolve())
    assert (tmp_path / "trace-store" / "fleet_intervals").is_dir()
    assert "fleet_history" not in report or report["fleet_history"]["rows"] == len(report["fleet"])
    assert report["fleet"] and report["plans"]
    assert report["fleet"][0]["granted"] >= 1
    assert torch.isfinite(torch.tensor(report["loss"])).all()
    # what the fleet cost, in the market's trace time (a second of it stands for p3's minute): at least one instance
    # held while it trained, at most the four asked for through the whole job
    cost = report["fleet_cost"]
    assert cost["instance_type"] == "p3.2xlarge" and cost["time_scale"] == 60.0
    train_s, wall_s = report["throughput"]["train_s"], report["wall_s"]
    assert train_s * 60 / 3600 <= cost["instance_hours"] <= 4 * wall_s * 60 / 3600, (cost, train_s, wall_s)
    assert cost["spot_usd"] == pytest.approx(cost["instance_hours"] * 0.612, abs=1e-5)
    line = f"fleet: {cost['instance_hours']:.2f} instance-hours of p3.2xlarge (in the market's trace time: 60x"
    assert line in res.output and f"${cost['spot_usd']:.2f} at spot" in res.output, res.output


def test_parcae_train_names_the_fleet_s_fix():
    runner = CliRunner()
    res = runner.invoke(app, ["train", "--provider", "market", "--market-trace", "p3"])
    assert res.exit_code != 0 and "--fleet N" in res.output
    res = runner.invoke(app, ["train", "--fleet", "4", "--trace", "p3"])
    assert res.exit_code != 0 and "replays no --trace" in res.output
    res = runner.invoke(app, ["train", "--fleet", "4"])
    assert res.exit_code != 0 and "--fleet: provider 'local' runs no live fleet" in res.output
    res = runner.invoke(app, ["train", "--market-trace", "p3", "--provider", "local", "--fleet", "2"])
    assert res.exit_code != 0 and "--market-trace is the market provider's option" in res.output
    res = runner.invoke(app, ["train", "--provider", "market", "--fleet", "2", "--market-trace", "no-such-trace"])
    assert res.exit_code == 2 and "unknown trace 'no-such-trace'" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize(
    ("kill_fraction", "market_options"),
    # (the noticed case: a 4 s notice; at the market's 2 s a CI run once saw the members killed at their deadline
    # before the boundary checkpoint they park at was complete: two steps lost)
    [(0.0, {"notice_s": 4.0}), (1.0, {"open_requests": True, "boot_s": 0.5})],
    ids=["every-instance-noticed", "every-instance-killed-open-requests-boot-delay"],
)
def test_a_fleet_the_cloud_takes_whole_waits_and_resumes_when_capacity_returns(tmp_path, kill_fraction,
                                                                               market_options):  # fmt: skip
    """2 instances for 6 s, none for 4, then 2 again. With notices, the members checkpoint the boundary they stop at
    and leave, and the job resumes there on the new instances (no step lost); killed without notice, it resumes
    from the latest periodic checkpoint. Either way the losses are the uninterrupted run's, and the fleet's history
    shows the empty intervals. (Enough steps that no machine trains them all in the first 6 s: a fast CI run once
    finished 100 unpaced ones before the market emptied, where this machine empties it at step 74-105; paced to
    0.06 s a step, about this machine's own, 130 take 7.8 s or more anywhere.)"""
    steps = 130
    market = tmp_path / "market.csv"
    market.write_text("0,2\n360000,0\n600000,2\n3600000,2\n")
    config = market_job(
        tmp_path / "job",
        market,
        steps=steps,
        max_instances=2,
        model=paced_gpt(0.06),
        checkpoint=CheckpointConfig(every=5),
        options={"kill_fraction": kill_fraction, **market_options},
        fleet={"record_history": False},
    )
    rec = RecordingObserver()
    report = train(config, planner=RulePlanner(), observer=rec)
    assert report["loss"] == pytest.approx(reference(steps), rel=1e-6)
    # the observers (a log, the progress display) are told why nothing trains: the first wait, the empty fleet
    waits = rec.of("fleet")
    assert [e["event"] for e in waits] == ["fleet-waiting", "fleet-empty", "fleet-back"], waits
    assert [h for h, _ in rec.calls][:2] == ["fleet", "start"] and waits[2]["waited_s"] > 2.0
    restarts = [r for r in report["reconfigurations"] if r["kind"] == "checkpoint-restart"]
    assert len(restarts) == 1, report["reconfigurations"]
    (restart,) = restarts
    assert restart["pause_s"] > 2.0  # it waited for the market (four empty seconds; the members leave at once)
    if kill_fraction == 0.0:
        assert restart["notice"] and restart["source"] == "sigterm" and restart["steps_lost"] == 0
    else:
        assert not restart["notice"] and restart["restore_step"] % 5 == 0
    alive = [r["alive"] for r in report["fleet"]]
    assert 0 in alive and alive[-1] == 2  # the empty intervals are in the history, and the fleet came back
    assert sum(r["reclaimed"] for r in report["fleet"]) == 2
    refused_while_empty = [r["refused"] for r in report["fleet"] if r["alive"] == 0]
    if market_options.get("open_requests"):
        assert not any(refused_while_empty)  # an open request waits in the market instead
    else:
        assert sum(refused_while_empty) >= 2


def test_the_fleet_s_history_is_appended_without_reading_the_store(tmp_path, monkeypatch):
    """Each interval's row is written while the interval's boundary waits: the writer never reads what the store
    holds (every part file of every fleet before it, a read that grows with the store)."""
    from trainer.observe.fleet_history import FleetHistoryWriter

    store = TraceStore(tmp_path / "store")
    store.append("fleet_intervals", [{"job_tag": "other@1", "provider": "market", "interval": 0, "interval_s": 60.0,
                                      "capacity": 4, "requested": 1, "granted": 1, "refused": 0, "reclaimed": 0,
                                      "alive": 1, "timestamp": "2026-12-01T00:00:00Z"}])  # fmt: skip
    writer = FleetHistoryWriter(tmp_path / "store", "job@1", "market", 60.0, 4)
    with monkeypatch.context() as m:
        m.setattr(TraceStore, "read", lambda *_a, **_k: pytest.fail("the writer read the store"))
        for i in range(3):
            writer(i, FleetRow(t=float(i), requested=1, granted=1, alive=2 + i, refused=0, reclaimed=0))
        writer.close()
    assert writer.summary()["rows"] == 3 and not writer.errors
    stored = store.read("fleet_intervals").sort_values(["job_tag", "interval"])
    assert stored[["job_tag", "interval", "alive"]].values.tolist() == [
        ["job@1", 0, 2], ["job@1", 1, 3], ["job@1", 2, 4], ["other@1", 0, 1]
    ]  # fmt: skip


def test_the_interval_s_boundary_does_not_wait_for_the_fleet_s_history_to_be_written(tmp_path, monkeypatch):
    """The row is told while training waits at the boundary: the writer queues it and returns; a write in flight
    (a PUT to S3) holds no boundary, the rows told meanwhile go into one part after it, and `close` (the job's end,
    or its failure) writes every row queued."""
    from trainer.observe.fleet_history import FleetHistoryWriter

    release, written = threading.Event(), []
    append = TraceStore.append

    def slow_append(self, table, rows, **kw):
        written.append(release.wait(timeout=30))  # False: nothing released it (the boundary waited on this write)
        return append(self, table, rows, **kw)

    monkeypatch.setattr(TraceStore, "append", slow_append)
    writer = FleetHistoryWriter(tmp_path / "store", "job@1", "market", 60.0, 4)
    for i in range(3):  # interval 0's write is in flight while 1 and 2 are told
        writer(i, FleetRow(t=float(i), requested=1, granted=1, alive=2 + i, refused=0, reclaimed=0))
    release.set()
    writer.close()
    # interval 0's part, then 1 and 2's (all three in one where the writer's thread first woke after them)
    assert written in ([True, True], [True]) and writer.rows == 3 and not writer.errors
    assert TraceStore(tmp_path / "store").fleet_histories()["fleet:job@1"]["available"].tolist() == [2, 3, 4]
    with pytest.raises(RuntimeError, match="closed"):
        writer(3, FleetRow(t=3.0, requested=0, granted=0, alive=4, refused=0, reclaimed=0))


def test_a_long_fleet_s_history_is_compacted_as_it_grows(tmp_path):
    """One part file per interval would make every read of the history (the planner's, each interval) open as many
    files as the fleet lived intervals: the writer compacts the table every COMPACT_AT rows, off the boundary."""
    from trainer.observe.fleet_history import FleetHistoryWriter

    writer = FleetHistoryWriter(tmp_path / "store", "job@1", "market", 60.0, 4)
    for i in range(COMPACT_AT + 2):
        writer(i, FleetRow(t=float(i), requested=1, granted=1, alive=i % 5, refused=0, reclaimed=0))
        writer.flush()  # a part per interval, as a fleet's boundaries a minute apart write them
    writer.close()  # waits for the compaction in flight; 3 parts left are under the threshold
    store = TraceStore(tmp_path / "store")
    assert len(store.parts("fleet_intervals")) == 3 and not writer.errors
    assert store.fleet_histories()["fleet:job@1"]["available"].tolist() == [i % 5 for i in range(COMPACT_AT + 2)]


def test_fleet_histories_in_the_trace_store_join_the_forecaster_s_corpus(tmp_path):
    from tasks.traces import load_training_corpus

    store = TraceStore(tmp_path / "store")
    rows = [{"job_tag": tag, "provider": "market", "interval": i, "interval_s": interval_s, "capacity": 8,
             "requested": 1, "granted": 1, "refused": 0, "reclaimed": 0, "alive": n,
             "timestamp": "2026-12-01T00:00:00Z"}
            for tag, interval_s, counts in [("a@1", 60.0, [4, 6, 8, 8, 5]), ("flat@1", 60.0, [4, 4, 4]),
                                            ("fast@1", 1.0, [2, 3, 4]), ("short@1", 60.0, [8])]
            for i, n in enumerate(counts)]  # fmt: skip
    store.append("fleet_intervals", rows)
    histories = store.fleet_histories()
    assert sorted(histories) == ["fleet:a@1", "fleet:fast@1", "fleet:flat@1"]  # one interval is no history
    assert histories["fleet:a@1"]["available"].tolist() == [4, 6, 8, 8, 5]
    corpus = training_corpus(store=store)
    assert "fleet:a@1" in corpus  # the flat one teaches nothing, the 1 s one is on another grid
    assert "fleet:flat@1" not in corpus and "fleet:fast@1" not in corpus
    assert list(training_corpus(["p3", "fleet:a@1"], store=store)) == ["p3", "fleet:a@1"]
    assert list(training_corpus(["p3"], store=store)) == ["p3"]  # named traces only, when names are given
    with pytest.raises(KeyError, match="fleet:nope"):
        training_corpus(["fleet:nope"], store=store)
    # the retrain flow's task reads the store when it exists, and ignores one that does not
    assert "fleet:a@1" in load_training_corpus.fn(None, store=str(tmp_path / "store"))
    assert not any(n.startswith("fleet:") for n in load_training_corpus.fn(None, store=str(tmp_path / "none")))
